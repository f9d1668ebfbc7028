# EXPECT kind=silent evidence=storage_swap op=aten::_has_compatible_shallow_copy_type node=MmBackward0 saved=0 current=0 raised=0 victim_op=aten::matmul exit=0
# EMA weights swapped in with `.data =` for an evaluation between the training forward and its
# backward, in a layer that uses its weight itself (`x @ self.weight`): the forward's matmul saved
# the live weight, whose storage is now the EMA copy, and backward reads the EMA values.
import torch

torch.manual_seed(0)


class Layer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(8, 8))

    def forward(self, x):
        return x @ self.weight  # VICTIM


model, ema = Layer(), Layer()
x = torch.randn(4, 8, requires_grad=True)
loss = model(x).square().sum()
live = model.weight.data
model.weight.data = ema.weight.data.clone()  # CULPRIT
with torch.no_grad():
    model(x)
loss.backward()
model.weight.data = live
