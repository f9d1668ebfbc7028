# EXPECT kind=silent evidence=unchecked_save raised=0 exit=0 node=_DequantMatmulBackward op=aten::mul_ victim_op=_DequantMatmul
# The write is one level down, in the quantization state object the Function keeps on its ctx
# (`ctx.state.absmax`): a rescale of the scales between forward and backward changes the weight
# backward dequantizes.
import torch


class QuantState:
    def __init__(self, absmax):
        self.absmax = absmax


class _DequantMatmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, packed, state):
        ctx.save_for_backward(packed)
        ctx.state = state
        return x @ (packed * state.absmax).t()

    @staticmethod
    def backward(ctx, grad):
        (packed,) = ctx.saved_tensors
        return grad @ (packed * ctx.state.absmax), None, None


packed = torch.randn(8, 16)
state = QuantState(torch.ones(8, 1))
x = torch.randn(4, 16, requires_grad=True)
y = _DequantMatmul.apply(x, packed, state)  # VICTIM
state.absmax.mul_(0.5)  # CULPRIT
y.sum().backward()
