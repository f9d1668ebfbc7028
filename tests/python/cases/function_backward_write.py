# EXPECT kind=version op=aten::sub_ node=SigmoidBackward0 raised=1 victim_op=aten::sigmoid function=_SoftplusScratch
# A Function's backward uses the tensor it saved as scratch (`x.sub_(...)`, then an `add_` meant to
# restore it), but another node saved the same tensor: autograd runs that node later in the same
# pass and raises. The write is named at its line inside backward, run by the backward() call.
import torch


class _SoftplusScratch(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.log1p(x.exp())

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        x.sub_(x.max())  # CULPRIT
        s = x.exp() / (x.exp() + torch.exp(-x.max()))
        x.add_(x.max())
        return grad * s


w = torch.randn(4, 8, requires_grad=True)
h = torch.sigmoid(w)  # VICTIM
y = _SoftplusScratch.apply(h)
y.sum().backward()  # CALLED_FROM
