# EXPECT kind=silent node=SigmoidBackward0 saved=0 current=0 raised=0 victim_op=aten::sigmoid exit=0 evidence=fingerprint verify_saved=1
# A write through numpy into a saved tensor's memory: no op runs, no version counter moves, and
# the gradient is silently wrong. Only --verify-saved's fingerprints see it; the candidate is the
# detach() that made the alias numpy writes through.
import torch

x = torch.randn(8, requires_grad=True)
y = torch.sigmoid(x)  # VICTIM
alias = y.detach().numpy()  # CANDIDATE
alias[:] = 0.5
y.sum().backward()
