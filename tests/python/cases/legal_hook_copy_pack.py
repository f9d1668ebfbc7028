# EXPECT violations=0 exit=0 tags=hooks
# Legal: a saved-tensor hook that packs a copy (as save_on_cpu does for a GPU tensor) makes a later
# write to the original harmless: backward uses the copy.
import torch

x = torch.randn(8, requires_grad=True)
with torch.autograd.graph.saved_tensors_hooks(lambda t: t.clone(), lambda t: t):
    y = torch.sigmoid(x)
    z = y * x
y.mul_(2)
z.sum().backward()
