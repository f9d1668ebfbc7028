# EXPECT violations=0 exit=0
# Legal: `.data =` on a parameter before any forward saved it (under no_grad, as initialization
# does), and after backward() used what the forward saved (as an EMA swap for evaluation does).
import torch

torch.manual_seed(0)
model = torch.nn.Linear(8, 8, bias=False)
with torch.no_grad():
    model.weight.data = torch.randn(8, 8) * 0.1
x = torch.randn(4, 8, requires_grad=True)
for step in range(2):
    model(x).square().sum().backward()
    live = model.weight.data
    model.weight.data = live.clone() * 0.5
    with torch.no_grad():
        model(x)
    model.weight.data = live
