# EXPECT kind=version op=aten::mul_ node=SigmoidBackward0 victim_op=aten::sigmoid raised=1 tags=compile,inductor,fullgraph
# torch.compile (inductor, fullgraph): inside the compiled function, a tensor that sigmoid saved for
# backward is modified in place. AOTAutograd traces the function's backward when it compiles it,
# and that trace raises on the first call; the ops run from torch.fx's Interpreter, and each
# reports the line of the graph node it runs (the user's).
import torch


def f(x, w):
    y = torch.sigmoid(x @ w)  # VICTIM
    y.mul_(2)  # CULPRIT
    return y.sum()


w = torch.randn(8, 8, requires_grad=True)
x = torch.randn(4, 8, requires_grad=True)
loss = torch.compile(f, fullgraph=True)(x, w)
loss.backward()
