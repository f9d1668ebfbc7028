# EXPECT kind=version evidence=- raised=1 exit=1 kind@2.11=silent evidence@2.11=unchecked_save raised@2.11=0 exit@2.11=0 node=CompiledFunctionBackward op=aten::mul_ victim_prefix=Torch-Compiled tags=compile,aot_eager,fullgraph
# torch.compile (aot_eager, fullgraph) of a user autograd.Function that stashes a tensor on its ctx
# (`ctx.w = w`) instead of save_for_backward: AOTAutograd keeps it in `ctx._tensors_no_vc_check`,
# which backward reads with no version check (from torch 2.11; before, AOTAutograd saved it with
# save_for_backward, checked). The program scales `w` in place before backward: PyTorch raises
# nothing, and x's gradient uses the scaled w. The victim is the region, named by the line its
# backward graph gives the node that reads the stashed tensor: the Function's backward line that
# reads it (torch 2.15), or the apply() call (2.9).
import torch


class Scale(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w):
        ctx.w = w
        return x * w

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.w, None  # VICTIM


def f(x, w):
    return Scale.apply(torch.tanh(x), w).sum()  # VICTIM


w = torch.randn(8)
x = torch.randn(8, requires_grad=True)
loss = torch.compile(f, backend="aot_eager", fullgraph=True)(x, w)
with torch.no_grad():
    w.mul_(2)  # CULPRIT
loss.backward()
