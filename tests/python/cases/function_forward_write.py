# EXPECT kind=version op=aten::sub_ node=PowBackward0 raised=1 victim_op=aten::pow function=_XEntropy
# A cross-entropy autograd.Function (the way chunked and vocab-parallel losses are written)
# subtracts the row max from its input in place inside its forward, after another op saved those
# logits for backward. The write is named at its line inside forward, not at the apply() call.
import torch


class _XEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, target):
        logits_max = logits.max(dim=-1, keepdim=True).values
        logits -= logits_max  # CULPRIT
        logsumexp = logits.exp().sum(dim=-1).log()
        ctx.save_for_backward(logits, logsumexp, target)
        return (logsumexp - logits.gather(-1, target[:, None]).squeeze(-1)).mean()

    @staticmethod
    def backward(ctx, grad):
        logits, logsumexp, target = ctx.saved_tensors
        probs = (logits - logsumexp[:, None]).exp()
        probs[torch.arange(len(target)), target] -= 1
        return probs * grad / len(target), None


hidden = torch.randn(4, 16, requires_grad=True)
head = torch.randn(16, 32, requires_grad=True)
logits = hidden @ head
z_loss = logits.pow(2).mean()  # VICTIM
target = torch.randint(0, 32, (4,))
loss = _XEntropy.apply(logits, target) + 1e-4 * z_loss  # CALLED_FROM
loss.backward()
