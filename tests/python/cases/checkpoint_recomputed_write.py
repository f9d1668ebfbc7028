# EXPECT kind=silent op=aten::mul_ node=SigmoidBackward0 saved=0 current=1 raised=0 exit=0 victim_op=aten::sigmoid tags=checkpoint,non_reentrant,recomputation
# Non-reentrant activation checkpointing recomputes the block in backward, in-place write
# included: SigmoidBackward0 gets the recomputed output after the write modified it. Without
# checkpointing PyTorch raises; with it, it says nothing and the gradient is wrong.
import torch
from torch.utils.checkpoint import checkpoint


def block(x, w):
    g = x @ w
    act = torch.sigmoid(g)  # VICTIM
    act.mul_(2)  # CULPRIT
    return torch.tanh(act) * x


w = torch.randn(8, 8, requires_grad=True)
x = torch.randn(4, 8, requires_grad=True)
y = checkpoint(block, x * 2, w, use_reentrant=False)
y.sum().backward()
