# EXPECT kind=silent evidence=unchecked_save raised=0 exit=0 node=_Matmul4bitBackward op=aten::copy_ victim_op=_Matmul4bit
# A 4-bit matmul Function keeps its packed weight and quantization state as ctx attributes
# (`ctx.tensors = (None, B)`, `ctx.state`), not with save_for_backward, and dequantizes again in
# backward. Layer streaming refills one staging buffer with the next layer's weight between forward
# and backward: backward dequantizes the wrong weight, and PyTorch checks nothing on ctx.
import torch


class QuantState:
    def __init__(self, absmax, shape):
        self.absmax = absmax
        self.shape = shape


class _Matmul4bit(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, packed, state):
        ctx.tensors = (None, packed)
        ctx.state = state
        return x @ (packed * state.absmax).t()

    @staticmethod
    def backward(ctx, grad):
        _, packed = ctx.tensors
        return grad @ (packed * ctx.state.absmax), None, None


layers = [torch.randn(8, 16) for _ in range(2)]
staging = torch.empty(8, 16)
state = QuantState(torch.ones(8, 1), (8, 16))
x = torch.randn(4, 16, requires_grad=True)
staging.copy_(layers[0])
y = _Matmul4bit.apply(x, staging, state)  # VICTIM
staging.copy_(layers[1])  # CULPRIT
y.sum().backward()
