# EXPECT kind=version op=aten::mul_ node=ExpBackward0 saved=0 current=1 raised=1 victim_op=aten::exp
# The write is two helper calls below the training code: the culprit is the innermost user line,
# and the stack holds the helpers' call lines.
import torch


def rescale(t):
    t.mul_(0.5)  # CULPRIT


def normalize(t):
    rescale(t)  # CALLER


def forward(x):
    e = torch.exp(x)  # VICTIM
    normalize(e)  # CALLER
    return e


x = torch.randn(5, requires_grad=True)
forward(x).sum().backward()
