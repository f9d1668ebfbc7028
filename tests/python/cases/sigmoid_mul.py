# EXPECT kind=version op=aten::mul_ node=SigmoidBackward0 saved=0 current=1 raised=1 victim_op=aten::sigmoid
import torch

x = torch.randn(8, requires_grad=True)
y = torch.sigmoid(x)  # VICTIM
y.mul_(2)  # CULPRIT
y.sum().backward()
