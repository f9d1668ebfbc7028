# EXPECT kind=silent evidence=unchecked_save op=aten::mul_ node=CheckpointFunctionBackward raised=0 exit=0 victim_op=CheckpointFunction read_by_recompute=1 tags=checkpoint,reentrant
# Reentrant checkpointing (use_reentrant=True, which prepare_model_for_kbit_training still selects)
# runs the block again in backward with the weights as they are then. A weight scaled between
# forward and backward: the gradient is that of the block with the scaled weight, and PyTorch,
# which checks only the block's inputs, says nothing.
import torch
from torch.utils.checkpoint import checkpoint

torch.manual_seed(0)
lin = torch.nn.Linear(8, 8)
lora_b = torch.nn.Parameter(torch.randn(8, 8) * 0.1)


def block(h):
    return torch.tanh(lin(h) + h @ lora_b)


x = torch.randn(4, 8, requires_grad=True)
y = checkpoint(block, x, use_reentrant=True)  # VICTIM
with torch.no_grad():
    lora_b.mul_(0.5)  # CULPRIT
y.sum().backward()
