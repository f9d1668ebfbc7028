# EXPECT cause=reentrant_checkpoint raised=1 params=4
# Adapters on a frozen base under checkpoint(use_reentrant=True): no input of the checkpointed
# blocks requires grad (the embedding is frozen), so their forward runs under no_grad and their
# output has no grad_fn. Backward raises.
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

    def forward(self, ids):
        h = self.embed(ids)
        for layer in self.layers:
            h = checkpoint(layer, h, use_reentrant=True)  # CUT
        return h.pow(2).mean()


torch.manual_seed(0)
model = Model()
for name, p in model.named_parameters():
    p.requires_grad_("lora_" in name)
loss = model(torch.randint(0, 16, (4, 5)))
loss.backward()
