# EXPECT kind=silent op=aten::mul_ node=SigmoidBackward0 saved=0 current=1 raised=0 exit=0 victim_op=aten::sigmoid tags=hooks,save_on_cpu
# torch.autograd.graph.save_on_cpu on a CPU tensor packs (device, tensor.cpu()), and .cpu() of a
# CPU tensor is the tensor itself: PyTorch's version check is off, and a write before backward
# silently changes the gradient.
import torch

x = torch.randn(8, requires_grad=True)
with torch.autograd.graph.save_on_cpu():
    y = torch.sigmoid(x)  # VICTIM
y.mul_(2)  # CULPRIT
y.sum().backward()
