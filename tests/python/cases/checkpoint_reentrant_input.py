# EXPECT kind=version op=aten::mul_ node=CheckpointFunctionBackward saved=0 current=1 raised=1 victim_op=CheckpointFunction tags=checkpoint,reentrant
# Reentrant activation checkpointing (use_reentrant=True): the checkpoint's own autograd Function
# saves the block's inputs; one of them is modified in place before backward.
import torch
from torch.utils.checkpoint import checkpoint


def block(x, w):
    return torch.tanh(x @ w)


w = torch.randn(8, 8, requires_grad=True)
x = torch.randn(4, 8, requires_grad=True)
h = x + 1
y = checkpoint(block, h, w, use_reentrant=True)  # VICTIM
h.mul_(3)  # CULPRIT
y.sum().backward()
