# EXPECT kind=unpack_hook culprit=hook node=SigmoidBackward0 saved=0 current=0 raised=1 victim_op=aten::sigmoid message=must_match_the_size tags=hooks
# An unpack hook that hands backward half the tensor it packed: PyTorch checks nothing of what the
# hook returns, and sigmoid's backward formula fails on the shapes.
import torch

x = torch.randn(8, requires_grad=True)
with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t[:4]):  # CULPRIT
    y = torch.sigmoid(x)  # VICTIM
y.sum().backward()
