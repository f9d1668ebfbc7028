# EXPECT kind=freed op=SigmoidBackward0 node=SigmoidBackward0 saved=0 current=0 raised=1 victim_op=aten::sigmoid
# The second backward() through the same graph: the first freed what SigmoidBackward0 saved.
import torch

x = torch.randn(8, requires_grad=True)
y = torch.sigmoid(x)  # VICTIM
loss = y.sum()
loss.backward()  # CULPRIT
loss.backward()
