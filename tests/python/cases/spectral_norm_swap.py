# EXPECT kind=silent evidence=storage_swap op=aten::_has_compatible_shallow_copy_type node=MmBackward0 saved=0 current=0 raised=0 victim_op=aten::matmul exit=0
# A spectral-norm layer as GAN code writes it: the weight rescaled through `.data =` at every
# forward, the discriminator called on real and fake data before one backward. The second call
# moves the weight to new storage after the first call's matmul saved it: backward reads the new
# values, and no version counter moves.
import torch

torch.manual_seed(0)


class SNLinear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(8, 8))

    def forward(self, x):
        sigma = torch.linalg.matrix_norm(self.weight.data, ord=2)
        self.weight.data = self.weight.data / sigma  # CULPRIT
        return x @ self.weight  # VICTIM


d = SNLinear()
real = torch.randn(4, 8, requires_grad=True)
fake = torch.randn(4, 8, requires_grad=True)
loss = d(real).mean() - d(fake).mean()
loss.backward()
