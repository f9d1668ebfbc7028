# EXPECT cause=no_grad raised=1 params=4
# The whole forward under torch.no_grad(): the loss has no history and backward raises.
import torch
import torch.nn.functional as F

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
x, y = torch.randn(4, 8), torch.randn(4, 1)
with torch.no_grad():
    out = model(x)  # CUT
loss = F.mse_loss(out, y)
loss.backward()
