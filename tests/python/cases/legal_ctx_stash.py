# EXPECT violations=0 exit=0
# Legal twins of ctx stashes: a stash no one writes; a stash written between forward and backward
# that backward never reads (a cache the Function keeps for the next call); a stash the Function's
# own backward writes after it read it; non-tensor state on ctx; and reentrant checkpointing, whose
# Function keeps RNG states and its inputs on ctx.
import torch
from torch.utils.checkpoint import checkpoint


class _Matmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, cache):
        ctx.weight = weight
        ctx.cache = cache
        ctx.shape = tuple(weight.shape)
        ctx.names = {"w": weight}
        return x @ weight.t()

    @staticmethod
    def backward(ctx, grad):
        out = grad @ ctx.weight
        ctx.weight.mul_(1.0)  # After its use: the gradient is already computed.
        return out, None, None


weight = torch.randn(8, 16)
cache = torch.zeros(4, 8)
x = torch.randn(4, 16, requires_grad=True)
y = _Matmul.apply(x, weight, cache)
cache.copy_(y.detach())  # Never read by backward.
h = checkpoint(lambda t: torch.tanh(t) * 2, y, use_reentrant=True)
h.sum().backward()
assert x.grad is not None
