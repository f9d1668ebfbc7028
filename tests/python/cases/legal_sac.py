# EXPECT violations=0 exit=0 tags=checkpoint,selective
# Legal under selective activation checkpointing: the cached matmul output is cloned before the
# in-place write, and the recomputed ops' own outputs are written inside the block.
import functools

import torch
from torch.utils import checkpoint as ckpt

SAVED_OPS = {torch.ops.aten.mm.default}
policy = functools.partial(
    ckpt.create_selective_checkpoint_contexts,
    lambda ctx, op, *args, **kwargs: (ckpt.CheckpointPolicy.MUST_SAVE if op in SAVED_OPS
                                      else ckpt.CheckpointPolicy.PREFER_RECOMPUTE))


def layer(inputs, weight):
    projected = inputs @ weight
    activated = torch.tanh(projected) + 1
    activated.mul_(0.5)
    return activated.sum(), projected


weight = torch.randn(8, 8, requires_grad=True)
inputs = torch.randn(4, 8, requires_grad=True)
loss, projected = ckpt.checkpoint(layer, inputs, weight, use_reentrant=False, context_fn=policy)
projected = projected.clone()
projected.mul_(3)
loss.backward()
