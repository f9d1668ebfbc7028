# EXPECT violations=0 exit=0 passes=2
# Legal: the first backward() keeps the graph (retain_graph=True) for the second.
import torch

x = torch.randn(8, requires_grad=True)
y = torch.sigmoid(x)
loss = y.sum()
loss.backward(retain_graph=True)
loss.backward()
