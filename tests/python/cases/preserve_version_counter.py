# EXPECT kind=silent evidence=counter_reset op=aten::mul_ node=SigmoidBackward0 saved=0 current=0 raised=0 victim_op=aten::sigmoid exit=0
# _unsafe_preserve_version_counter sets y's counter back after the write: the version check passes
# and the gradient is silently wrong.
import torch

x = torch.randn(8, requires_grad=True)
y = torch.sigmoid(x)  # VICTIM
with torch.autograd._unsafe_preserve_version_counter(y):
    y.mul_(2)  # CULPRIT
y.sum().backward()
