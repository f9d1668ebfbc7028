# EXPECT kind=unpack_hook culprit=hook node=MmBackward0 saved=0 current=0 raised=1 victim_op=aten::mm message=expected_m1_and_m2_to_have_the_same_dtype tags=hooks
# A hook that keeps activations in float16 on the CPU and forgets to cast them back: PyTorch checks
# nothing of what the unpack hook returns, and mm's backward fails on the mixed dtypes. The line
# to fix is the hook's.
import torch


def pack(t):
    return t.to("cpu", torch.float16)


def unpack(packed):  # CULPRIT
    return packed


x = torch.randn(4, 8, requires_grad=True)
w = torch.randn(8, 8, requires_grad=True)
with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
    y = torch.mm(x, w)  # VICTIM
y.sum().backward()
