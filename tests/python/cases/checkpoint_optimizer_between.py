# EXPECT kind=silent op=aten::add_ node=MmBackward0 raised=0 exit=0 victim_op=aten::linear tags=checkpoint,non_reentrant,optimizer
# An optimizer step between the forward and backward under activation checkpointing: the
# recomputation in backward reads the stepped weight, so the gradient belongs to another forward.
# Without checkpointing PyTorch raises; with it, nothing.
import torch
from torch.utils.checkpoint import checkpoint

torch.manual_seed(0)
layer = torch.nn.Linear(8, 8, bias=False)
optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)


def block(x):
    return torch.tanh(layer(x))  # VICTIM


x = torch.randn(4, 8, requires_grad=True)
checkpoint(block, x, use_reentrant=False).sum().backward()
loss = checkpoint(block, x, use_reentrant=False).sum()
optimizer.step()  # CULPRIT
loss.backward()
