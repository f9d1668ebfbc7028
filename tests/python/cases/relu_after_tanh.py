# EXPECT kind=version op=aten::relu_ node=TanhBackward0 saved=0 current=1 raised=1 victim_op=aten::tanh
import torch

x = torch.randn(4, 4, requires_grad=True)
t = torch.tanh(x @ x)  # VICTIM
t.relu_()  # CULPRIT
t.mean().backward()
