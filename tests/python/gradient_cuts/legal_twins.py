# EXPECT exit=0
# What must stay silent, one step each: a frozen base with trained adapters; a teacher used under
# no_grad (its parameters require grad and get none, by design); reentrant checkpointing with the
# input made to require grad (what enable_input_require_grads() does); non-reentrant
# checkpointing with a frozen embedding; an accuracy computed with .item() and detach().
import torch
import torch.nn.functional as F
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
    def __init__(self, mode):
        super().__init__()
        self.mode = mode
        self.embed = torch.nn.Embedding(16, 8)
        self.layers = torch.nn.ModuleList([Block(), Block()])

    def forward(self, ids):
        h = self.embed(ids)
        if self.mode == "reentrant":
            h.requires_grad_(True)  # As enable_input_require_grads()'s hook does.
        for layer in self.layers:
            if self.mode == "plain":
                h = layer(h)
            else:
                h = checkpoint(layer, h, use_reentrant=self.mode == "reentrant")
        return h


torch.manual_seed(0)
teacher = torch.nn.Sequential(torch.nn.Embedding(16, 8), torch.nn.Linear(8, 8))
for mode in ("plain", "reentrant", "non_reentrant"):
    model = Model(mode)
    for name, p in model.named_parameters():
        p.requires_grad_("lora_" in name)
    ids = torch.randint(0, 16, (4, 5))
    with torch.no_grad():
        target = teacher(ids)
    out = model(ids)
    loss = F.mse_loss(out, target)
    accuracy = (out.detach().argmax(-1) == target.argmax(-1)).float().mean().item()
    loss.backward()
    assert all(p.grad is not None for n, p in model.named_parameters() if "lora_" in n), mode
