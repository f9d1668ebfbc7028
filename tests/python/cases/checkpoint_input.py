# EXPECT kind=version op=aten::add_ node=_NoopSaveInputsBackward saved=0 current=1 raised=1 victim_op=_NoopSaveInputs tags=checkpoint,non_reentrant
# Activation checkpointing (non-reentrant, as transformers' gradient_checkpointing_enable() uses):
# the checkpoint keeps the block's inputs to recompute it in backward; one of them is modified in
# place before backward. PyTorch raises inside the recomputation; the victim is the checkpointed
# call.
import torch
from torch.utils.checkpoint import checkpoint


def block(x, w):
    return torch.sigmoid(x @ w) * x


w = torch.randn(8, 8, requires_grad=True)
x = torch.randn(4, 8, requires_grad=True)
h = x * 2
y = checkpoint(block, h, w, use_reentrant=False)  # VICTIM
h.add_(1)  # CULPRIT
y.sum().backward()
