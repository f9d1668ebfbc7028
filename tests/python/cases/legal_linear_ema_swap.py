# EXPECT violations=0 exit=0
# Legal: the same EMA swap on an nn.Linear. Its matmul saved a transposed view of the weight,
# which keeps the storage it viewed when `.data =` moves the weight to another: backward reads
# the values the forward used.
import torch

torch.manual_seed(0)
model = torch.nn.Linear(8, 8, bias=False)
ema = torch.nn.Linear(8, 8, bias=False)
x = torch.randn(4, 8, requires_grad=True)
loss = model(x).square().sum()
live = model.weight.data
model.weight.data = ema.weight.data.clone()
with torch.no_grad():
    model(x)
loss.backward()
model.weight.data = live
