# EXPECT kind=version op=aten::mul_ node=SigmoidBackward0 saved=0 current=1 raised=1 victim_op=aten::sigmoid
# A tensor hook runs inside backward, in autograd's engine, before SigmoidBackward0 needs its
# saved output: the culprit line is the hook's.
import torch

x = torch.randn(8, requires_grad=True)
y = torch.sigmoid(x)  # VICTIM
w = y * 2
w.register_hook(lambda grad: y.mul_(2))  # CULPRIT
w.sum().backward()
