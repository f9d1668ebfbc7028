# EXPECT kind=version op=aten::add_ node=_NoopSaveInputsBackward node@2.12=_CheckpointFrame.saved_args saved=0 current=1 raised=1 victim_op=_NoopSaveInputs victim_op@2.12=_CheckpointFrame.save_inputs tags=checkpoint,non_reentrant
# Activation checkpointing (non-reentrant, as transformers' gradient_checkpointing_enable() uses):
# the checkpoint keeps the block's inputs to recompute it in backward; one of them is modified in
# place before backward. PyTorch raises inside the recomputation; the victim is the checkpointed
# call. Up to torch 2.11 an autograd node keeps the inputs (_NoopSaveInputs); from 2.12 the
# checkpoint frame does (_CheckpointFrame.save_inputs), and torchrr names that.
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
