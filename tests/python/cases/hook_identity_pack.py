# EXPECT kind=silent op=aten::mul_ node=SigmoidBackward0 saved=0 current=1 raised=0 exit=0 victim_op=aten::sigmoid tags=hooks
# A saved-tensor hook that packs the tensor itself turns PyTorch's version check off: the write
# between forward and backward goes unreported by PyTorch, and the gradient uses the modified
# value.
import torch

x = torch.randn(8, requires_grad=True)
with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
    y = torch.sigmoid(x)  # VICTIM
y.mul_(2)  # CULPRIT
y.sum().backward()
