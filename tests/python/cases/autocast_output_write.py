# EXPECT kind=version op=aten::mul_ node=SigmoidBackward0 saved=0 current=1 raised=1 victim_op=aten::sigmoid tags=autocast
# Under bf16 autocast, an activation that sigmoid saved is scaled in place before backward.
import torch

torch.manual_seed(0)
linear = torch.nn.Linear(8, 8)
x = torch.randn(4, 8)
with torch.autocast("cpu", dtype=torch.bfloat16):
    h = torch.sigmoid(linear(x))  # VICTIM
    h.mul_(2)  # CULPRIT
    loss = h.float().sum()
loss.backward()
