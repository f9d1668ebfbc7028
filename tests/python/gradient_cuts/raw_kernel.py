# EXPECT cause=no_backward raised=1
# A buffer filled outside autograd (a raw copy through data_ptr, as a kernel with no backward
# would): its values come from the model, its history does not.
import ctypes

import torch

torch.manual_seed(0)
model = torch.nn.Linear(8, 8)
x = torch.randn(4, 8)
h = torch.relu(model(x))
out = torch.empty_like(h)  # CUT
ctypes.memmove(out.data_ptr(), h.data_ptr(), h.numel() * h.element_size())
loss = out.sum()
loss.backward()
