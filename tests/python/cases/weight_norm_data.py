# EXPECT kind=silent evidence=aliased_write op=aten::div_ node=MmBackward0 saved=0 current=0 raised=0 victim_op=aten::matmul exit=0
# Weight normalization written through `.data`: the weight is rescaled in place through its
# `.data` alias after the forward's matmul saved it. The alias has a counter of its own, so
# PyTorch raises nothing and backward uses the rescaled weight.
import torch

torch.manual_seed(0)
w = torch.nn.Parameter(torch.randn(8, 8))
x = torch.randn(4, 8, requires_grad=True)
loss = (x @ w).square().sum()  # VICTIM
w.data.div_(w.data.norm())  # CULPRIT
loss.backward()
