# EXPECT kind=detached op=aten::detach_ node=SinBackward0 saved=0 current=0 raised=1 victim_op=aten::sin
# detach_() on a tensor that sin() saved as its input: the saved tensor loses its grad_fn, and
# backward raises when it unpacks it.
import torch

x = torch.randn(8, requires_grad=True)
a = x * 2
b = a.sin()  # VICTIM
a.detach_()  # CULPRIT
b.sum().backward()
