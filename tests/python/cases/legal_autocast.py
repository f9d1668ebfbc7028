# EXPECT violations=0 exit=0 tags=autocast,grad_scaler
# Legal under bf16 autocast with a GradScaler: autocast's cast copies of the weights, the scaler's
# in-place unscale and inf checks on the gradients, and the optimizer's step after backward.
import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 1))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
scaler = torch.amp.GradScaler("cpu")
x = torch.randn(4, 8)
for step in range(2):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(x).float().pow(2).mean()
    optimizer.zero_grad()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
