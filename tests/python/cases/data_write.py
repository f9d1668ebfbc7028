# EXPECT kind=silent node=SigmoidBackward0 saved=0 current=0 raised=0 victim_op=aten::sigmoid exit=0
# A write through .data shares the storage but not the version counter: PyTorch raises nothing
# and the gradient is silently wrong.
import torch

x = torch.randn(8, requires_grad=True)
y = torch.sigmoid(x)  # VICTIM
y.data.mul_(2)  # CULPRIT
y.sum().backward()
