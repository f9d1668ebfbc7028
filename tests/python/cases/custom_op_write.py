# EXPECT kind=version op=torchrr_case::scale_ node=SigmoidBackward0 raised=1 victim_op=aten::sigmoid
# A torch.library custom op (the way Liger, flash-attn and bitsandbytes ship their kernels) that
# declares it mutates its argument, writing a saved tensor. PyTorch bumps the argument's version
# around the op's body as well as inside it, so the culprit is the custom op's call, not a write
# nobody recorded. (How many bumps it makes depends on the torch release: no versions here.)
import torch


@torch.library.custom_op("torchrr_case::scale_", mutates_args=("x",))
def scale_(x: torch.Tensor, s: float) -> None:
    x.mul_(s)


x = torch.randn(8, requires_grad=True)
y = torch.sigmoid(x)  # VICTIM
with torch.no_grad():
    scale_(y, 0.5)  # CULPRIT
y.sum().backward()
