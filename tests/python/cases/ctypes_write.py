# EXPECT kind=silent evidence=fingerprint culprit=none node=SigmoidBackward0 saved=0 current=0 raised=0 victim_op=aten::sigmoid exit=0 verify_saved=1
# A fused loss that stores into its input's memory through data_ptr(), as Triton and CUDA
# kernels do (here ctypes.memmove): no op runs and no version counter moves, so PyTorch raises
# nothing and the gradient is silently wrong. --verify-saved's fingerprints see the bytes change;
# no recorded op wrote them.
import ctypes

import torch

torch.manual_seed(0)
x = torch.randn(8, requires_grad=True)
y = torch.sigmoid(x)  # VICTIM
zeros = torch.zeros(8)
ctypes.memmove(y.data_ptr(), zeros.data_ptr(), 8 * y.element_size())
y.sum().backward()
