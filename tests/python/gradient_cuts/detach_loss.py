# EXPECT cause=detach raised=1
# detach() inside the loss: the values go on, the graph does not.
import torch

torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
x, y = torch.randn(4, 8), torch.randn(4, 1)
pred = model(x)
loss = ((pred.detach() - y) ** 2).mean()  # CUT
loss.backward()
