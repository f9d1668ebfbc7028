# EXPECT violations=0 exit=0 tags=hooks
# Legal: activations kept in float16 and cast back, around scaled dot-product attention, whose
# backward also saved the logsumexp it returned: an output that needs no gradient, whose
# output_nr is 0 though it is output 1. What the unpack hook returns for it is its own shape.
import torch
import torch.nn.functional as F


def pack(t):
    return t.dtype, t.to(torch.float16)


def unpack(packed):
    dtype, t = packed
    return t.to(dtype)


q, k, v = (torch.randn(2, 4, 16, 8, requires_grad=True) for _ in range(3))
with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
out.sum().backward()
