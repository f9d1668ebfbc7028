# EXPECT kind=cached_mutated op=aten::mul_ node=SigmoidBackward0 saved=0 current=1 raised=1 victim_op=aten::matmul message=Tensor_cached_during_selective_activation_checkpoint_has_been_mutated tags=checkpoint,selective
# Selective activation checkpointing (a policy that saves matmuls) caches the matmul's output in
# forward; the program then modifies that output in place, and backward's recomputation raises.
import functools

import torch
from torch.utils.checkpoint import (CheckpointPolicy, checkpoint,
                                    create_selective_checkpoint_contexts)


def policy(ctx, op, *args, **kwargs):
    if op == torch.ops.aten.mm.default:
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


def block(x, w):
    h = x @ w  # VICTIM
    return torch.sigmoid(h) * 2, h


w = torch.randn(8, 8, requires_grad=True)
x = torch.randn(4, 8, requires_grad=True)
y, h = checkpoint(block, x, w, use_reentrant=False,
                  context_fn=functools.partial(create_selective_checkpoint_contexts, policy))
h.mul_(3)  # CULPRIT
y.sum().backward()
