# EXPECT violations=0 exit=0
# Legal twins of writes inside a Function: a forward that writes in place only into a tensor it
# made itself (the shifted logits), and a backward that turns the buffer it saved, which nothing
# else saved, into the gradient in place (the memory trick fused loss kernels use), once.
import torch


class _XEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, target):
        shifted = logits - logits.max(dim=-1, keepdim=True).values
        shifted -= shifted.exp().sum(dim=-1, keepdim=True).log()
        probs = shifted.exp()
        ctx.save_for_backward(probs, target)
        return -shifted.gather(-1, target[:, None]).mean()

    @staticmethod
    def backward(ctx, grad):
        probs, target = ctx.saved_tensors
        probs[torch.arange(len(target)), target] -= 1
        probs.mul_(grad / len(target))
        return probs, None


hidden = torch.randn(4, 16, requires_grad=True)
head = torch.randn(16, 32, requires_grad=True)
logits = hidden @ head
z_loss = logits.pow(2).mean()
target = torch.randint(0, 32, (4,))
loss = _XEntropy.apply(logits, target) + 1e-4 * z_loss
loss.backward()
assert hidden.grad is not None and torch.isfinite(hidden.grad).all()
