# EXPECT kind=version node=AddmmBackward0 raised=1 victim_op=aten::linear
# The SGD step runs inside the optimizer's record_function scope (torch/optim/optimizer.py):
# its writes are nested ops, yet the culprit line is the step() call.
import torch

model = torch.nn.Linear(4, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(3, 4, requires_grad=True)
model(x).sum().backward()  # Gives the parameters gradients for the step below.
loss = model(x).sum()  # VICTIM
opt.step()  # CULPRIT
loss.backward()
