# EXPECT kind=version op=aten::add_ node=MulBackward0 saved=0 current=1 raised=1 victim_op=aten::mul
import torch

w1 = torch.randn(8, requires_grad=True)
w2 = torch.randn(8, requires_grad=True)
h = w1 * 2
out = h * w2  # VICTIM
h += torch.ones(8)  # CULPRIT
out.sum().backward()
