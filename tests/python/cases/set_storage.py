# EXPECT kind=version op=aten::set_ node=MmBackward0 saved=0 current=1 raised=1 victim_op=aten::matmul exit=1
# A weight re-pointed at another storage with set_() between the forward that saved it and the
# backward that uses it: set_ is an in-place op on the weight, so its version counter moves and
# PyTorch raises.
import torch

torch.manual_seed(0)
w = torch.nn.Parameter(torch.randn(4, 4))
x = torch.randn(2, 4, requires_grad=True)
y = x @ w  # VICTIM
with torch.no_grad():
    w.set_(torch.randn(4, 4))  # CULPRIT
y.sum().backward()
