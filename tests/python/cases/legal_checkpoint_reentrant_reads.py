# EXPECT violations=0 exit=0 tags=checkpoint,reentrant
# Legal twins of a weight changed before a reentrant checkpoint's recomputation: a block whose
# BatchNorm updates its running statistics in forward (and again when recomputed), and weights
# updated by the optimizer only after backward, step after step.
import torch
from torch.utils.checkpoint import checkpoint

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8), torch.nn.Tanh())
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(2):
    x = torch.randn(4, 8, requires_grad=True)
    y = checkpoint(model, x, use_reentrant=True)
    y.pow(2).mean().backward()
    opt.step()
    opt.zero_grad()
