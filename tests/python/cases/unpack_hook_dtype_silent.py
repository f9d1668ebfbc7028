# EXPECT kind=silent evidence=unpack_hook culprit=hook node=SigmoidBackward0 saved=0 current=0 raised=0 exit=0 victim_op=aten::sigmoid tags=hooks
# A hook that keeps activations in float16 and forgets to cast them back: sigmoid's backward
# takes the float16 output it gets, promotes, and the engine casts the gradient to float32. No
# error; the gradient was computed from rounded values.
import torch


def pack(t):
    return t.to(torch.float16)


def unpack(packed):  # CULPRIT
    return packed


x = torch.randn(8, requires_grad=True)
with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
    y = torch.sigmoid(x)  # VICTIM
y.sum().backward()
