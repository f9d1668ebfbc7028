# EXPECT violations=0 exit=0
# Legal: the optimizer steps after backward, twice, with zero_grad in between.
import torch

model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
opt = torch.optim.AdamW(model.parameters(), lr=0.01)
x = torch.randn(16, 4)
for _ in range(2):
    opt.zero_grad()
    loss = model(x).pow(2).mean()
    loss.backward()
    opt.step()
