# EXPECT kind=version op=aten::masked_fill_ node=SoftmaxBackward0 saved=0 current=1 raised=1 victim_op=aten::softmax
import torch

scores = torch.randn(2, 6, 6, requires_grad=True)
probs = torch.softmax(scores * 0.5, dim=-1)  # VICTIM
future = torch.ones(6, 6, dtype=torch.bool).triu(1)
probs.masked_fill_(future, 0.0)  # CULPRIT
(probs @ torch.randn(6, 3)).sum().backward()
