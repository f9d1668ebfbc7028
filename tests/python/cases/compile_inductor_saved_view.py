# EXPECT kind=silent evidence=aliased_write node=CompiledFunctionBackward saved=0 current=0 raised=0 exit=0 op=aten::add_ victim_prefix=Torch-Compiled tags=compile,inductor
# torch.compile (inductor): the region saves a view of its input for backward (x[:, :4], the
# matmul's operand). Inductor hands the saved view back as a new tensor over the input's memory,
# with a version counter of its own, so the program's in-place write to the input between forward
# and backward moves a counter PyTorch does not check: no error, and w's gradient is computed from
# the modified values (eager and aot_eager raise). The victim is the region, named by the line
# inside it that saved the view.
import torch


def f(x, w):
    return torch.sigmoid(x[:, :4] @ w)  # VICTIM


w = torch.randn(4, 8, requires_grad=True)
x = torch.randn(6, 8, requires_grad=True)
h = x * 2
y = torch.compile(f)(h, w)
h.add_(1)  # CULPRIT
y.sum().backward()
