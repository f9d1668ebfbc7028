# EXPECT violations=0 exit=0 tags=checkpoint,non_reentrant,reentrant
# Legal under activation checkpointing: in-place ops inside the checkpointed block (recomputed in
# backward from unmodified inputs), a write to the block's output after a clone, and writes to the
# inputs after backward.
import torch
from torch.utils.checkpoint import checkpoint


def block(x, w):
    y = x @ w
    y.relu_()
    return y * x


w = torch.randn(8, 8, requires_grad=True)
x = torch.randn(4, 8, requires_grad=True)
for reentrant in (False, True):
    h = x * 2
    y = checkpoint(block, h, w, use_reentrant=reentrant)
    z = y.clone()
    z.add_(1)
    (y.sum() + z.sum()).backward()
    h.add_(1)
