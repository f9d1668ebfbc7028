"""`torchrr fix --check`'s gradient runs: the patched program, run without the recorder, writes
the gradients of its first backward passes and stops.

PyTorch raised nothing for a silent violation, so a clean replay of the patched program does not
show that its gradients are now right. `fix --check` then runs it twice more with this directory
first on PYTHONPATH:

- TORCHRR_FIX_GRADIENTS names the JSON file to write: for each backward pass (torch.autograd's
  backward() or grad()) up to TORCHRR_FIX_PASSES, the gradient of each leaf it reached, in the
  order a walk of its graph from the roots meets them, as [shape, sum, sum of squares] in
  float64. The process ends once they are written.
- With TORCHRR_FIX_SNAPSHOT=1, every tensor autograd saves is saved as a copy (an outermost
  saved_tensors_hooks), so that backward reads what the forward saved whatever writes it
  afterwards: the gradients of the program with every in-place write made out of place.

Both runs seed torch, random and numpy alike before the program runs. Nothing here raises into
the program: trouble prints one ``torchrr: warning:`` line and the file is not written.
"""
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _chain_to_next_sitecustomize():
    """Runs the sitecustomize this one hides, as the recorder's does (torchrr/_site_chain.py)."""
    import runpy
    try:
        chain = runpy.run_path(os.path.join(os.path.dirname(_HERE), "_site_chain.py"))
    except Exception as error:  # A torchrr install without the file: the program goes on.
        sys.stderr.write("torchrr: warning: the sitecustomize after torchrr's did not run: "
                         f"{error!r}\n")
        return
    chain["run_next_sitecustomize"](_HERE)


def _leaves(roots):
    """The leaf tensors a backward from `roots` accumulates into, in depth-first order."""
    found, seen = [], set()
    stack = [t.grad_fn if t.grad_fn is not None else t for t in roots][::-1]
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        variable = getattr(node, "variable", None)
        if variable is not None or not hasattr(node, "next_functions"):
            found.append(node if variable is None else variable)
            continue
        stack.extend(next_node for next_node, _ in reversed(node.next_functions))
    return found


def _stats(tensor):
    if tensor is None:
        return None
    values = tensor.detach().double()
    return [list(tensor.shape), float(values.sum()), float((values * values).sum())]


def _install(path, passes, snapshot):
    import atexit
    import json
    import random

    import torch

    random.seed(0)
    torch.manual_seed(0)
    if _has_numpy():
        import numpy
        numpy.random.seed(0)
    if snapshot:
        torch.autograd.graph.saved_tensors_hooks(lambda t: t.clone(), lambda t: t).__enter__()
    written = []

    def write():
        with open(path, "w") as f:
            json.dump(written, f)

    def done(grads):
        written.append(grads)
        if len(written) >= passes:
            write()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)

    backward, grad = torch.autograd.backward, torch.autograd.grad

    def tracing(tensors):
        """Whether torch.compile is tracing the call (AOTAutograd calls torch.autograd.grad on
        fake tensors as it builds a region's backward): not a backward pass of the program."""
        if torch.compiler.is_compiling():
            return True
        try:
            from torch._guards import detect_fake_mode
            return detect_fake_mode([t for t in tensors if isinstance(t, torch.Tensor)]) is not None
        except Exception:
            return False

    def traced_backward(tensors, *args, **kwargs):
        roots = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)
        if tracing(roots):
            return backward(tensors, *args, **kwargs)
        leaves = _leaves(roots)
        result = backward(tensors, *args, **kwargs)
        done([_stats(leaf.grad) for leaf in leaves])
        return result

    def traced_grad(*args, **kwargs):
        result = grad(*args, **kwargs)
        if not tracing(list(result)):
            done([_stats(g) for g in result])
        return result

    torch.autograd.backward, torch.autograd.grad = traced_backward, traced_grad

    def at_exit():  # A program with fewer passes: what it ran.
        if written and not os.path.exists(path):
            write()
    atexit.register(at_exit)


def _has_numpy():
    import importlib.util
    return importlib.util.find_spec("numpy") is not None


_chain_to_next_sitecustomize()
if os.environ.get("TORCHRR_FIX_GRADIENTS"):
    try:
        _install(os.environ["TORCHRR_FIX_GRADIENTS"],
                 int(os.environ.get("TORCHRR_FIX_PASSES", "1")),
                 os.environ.get("TORCHRR_FIX_SNAPSHOT") == "1")
    except Exception as error:
        sys.stderr.write(f"torchrr: warning: the gradients are not written: {error!r}\n")
