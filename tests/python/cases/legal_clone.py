# EXPECT violations=0 exit=0
# Legal: the in-place write goes to a clone, and an in-place op before anything saves the tensor.
import torch

x = torch.randn(8, requires_grad=True)
h = x * 2
h.add_(1)  # Nothing has saved h yet.
y = torch.sigmoid(h)
z = y.clone()
z.mul_(2)
(y + z).sum().backward()
