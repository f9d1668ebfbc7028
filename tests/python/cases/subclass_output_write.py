# EXPECT kind=version op=aten::mul_ node=SigmoidBackward0 saved=0 current=1 raised=1 victim_op=aten::sigmoid tags=subclass
# A wrapper tensor subclass (__torch_dispatch__, as torch's TwoTensor builds it): sigmoid's saved
# output is modified in place; the subclass's ops below autograd change nothing.
import warnings

import torch
from torch.testing._internal.two_tensor import TwoTensor

warnings.simplefilter("ignore")
a = TwoTensor(torch.randn(4, 4), torch.randn(4, 4)).requires_grad_()
y = a.sigmoid()  # VICTIM
y.mul_(2)  # CULPRIT
y.sum().backward()
