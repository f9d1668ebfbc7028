# EXPECT kind=version op=aten::add_ node=SquareBackward saved=0 current=1 raised=1 victim_op=Square
"""A custom torch.autograd.Function saves its input with ctx.save_for_backward; the input is
then modified in place."""
import torch


class Square(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return 2 * x * grad


w = torch.randn(8, requires_grad=True)
h = w * 1.0
y = Square.apply(h)  # VICTIM
h.add_(1)  # CULPRIT
y.sum().backward()
