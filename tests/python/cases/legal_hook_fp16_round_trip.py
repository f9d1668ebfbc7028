# EXPECT violations=0 exit=0 tags=hooks
# Legal: a hook that keeps activations in float16 on the CPU and casts them back to the dtype and
# device they were saved with: backward gets tensors of the saved dtype and shape.
import torch


def pack(t):
    return t.dtype, t.device, t.to("cpu", torch.float16)


def unpack(packed):
    dtype, device, t = packed
    return t.to(device, dtype)


x = torch.randn(4, 8, requires_grad=True)
w = torch.randn(8, 8, requires_grad=True)
with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
    y = torch.sigmoid(torch.mm(x, w))
y.sum().backward()
