# EXPECT cause=item raised=1
# .item() turned back into a tensor: a Python number has no history.
import torch

torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
x = torch.randn(4, 8)
total = model(x).pow(2).mean().item()  # CUT
loss = torch.tensor(total) * 0.5
loss.backward()
