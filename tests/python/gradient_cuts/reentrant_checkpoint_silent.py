# EXPECT cause=reentrant_checkpoint raised=0 params=4 exit=0
# The same blocks, and a trainable head after them: backward runs and trains the head, and never
# reaches the adapters inside the checkpoints. Nothing raises; lora_A/lora_B keep grad None.
import torch
from torch.utils.checkpoint import checkpoint


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.base = torch.nn.Linear(8, 8)
        self.lora_A = torch.nn.Linear(8, 2, bias=False)
        self.lora_B = torch.nn.Linear(2, 8, bias=False)

    def forward(self, h):
        return torch.tanh(self.base(h) + self.lora_B(self.lora_A(h)))


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(16, 8)
        self.layers = torch.nn.ModuleList([Block(), Block()])
        self.head = torch.nn.Linear(8, 1)

    def forward(self, ids):
        h = self.embed(ids)
        for layer in self.layers:
            h = checkpoint(layer, h, use_reentrant=True)  # CUT
        return self.head(h).pow(2).mean()


torch.manual_seed(0)
model = Model()
for name, p in model.named_parameters():
    p.requires_grad_("lora_" in name or "head" in name)
optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
for _ in range(2):
    loss = model(torch.randint(0, 16, (4, 5)))
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
assert all(p.grad is None for n, p in model.named_parameters() if "lora_" in n)
