# EXPECT violations=0 exit=0 verify_saved=1
# Legal: the raw write (ctypes.memmove through data_ptr()) goes into a clone of the saved tensor.
import ctypes

import torch

torch.manual_seed(0)
x = torch.randn(8, requires_grad=True)
y = torch.sigmoid(x)
out = y.clone()
zeros = torch.zeros(8)
ctypes.memmove(out.data_ptr(), zeros.data_ptr(), 8 * out.element_size())
(y.sum() + out.sum()).backward()
