# EXPECT violations=0 exit=1 message=Tensor_cached_during_selective_activation_checkpoint_has_been_mutated tags=checkpoint,selective
# Selective activation checkpointing caches the matmul's output in forward; the program then
# modifies it in place, and the recomputation in backward raises. torchrr does not yet tie the
# cache to the op that filled it: the replay reports PyTorch's error as one it does not explain,
# never as a violation of another kind.
import functools

import torch
from torch.utils.checkpoint import (CheckpointPolicy, checkpoint,
                                    create_selective_checkpoint_contexts)


def policy(ctx, op, *args, **kwargs):
    if op == torch.ops.aten.mm.default:
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


def block(x, w):
    h = x @ w
    return torch.sigmoid(h) * 2, h


w = torch.randn(8, 8, requires_grad=True)
x = torch.randn(4, 8, requires_grad=True)
y, h = checkpoint(block, x, w, use_reentrant=False,
                  context_fn=functools.partial(create_selective_checkpoint_contexts, policy))
h.mul_(3)
y.sum().backward()
