"""Where a torch.compile region's backward uses each tensor its forward saved.

The recorder runs this file's saved_uses() in the recorded process, under the GIL, the first time
an apply of a compiled region's autograd.Function ends recorded (its text is built into the
recorder: recorder/src/python/compiled_regions.cc). AOTAutograd keeps the graph it traced for
backward (the CompiledFunction's ``_lazy_backward_info.bw_module``, a torch.fx GraphModule, until
its meta is stripped when the compiled result is cached), whose first placeholders are the saved
tensors in ctx order (``saved_tensors``, then ``_tensors_no_vc_check``; symbolic ints and opaque
objects are no tensors) and whose nodes keep the traceback of the forward op they differentiate
(``meta["stack_trace"]``). Per saved tensor: the traceback of the first node reading it, "" when
none has one; [] when nothing is known. Reads attributes and dicts only: no tensor op runs.
"""


def saved_uses(ctx_class):
    import torch
    forward_class = getattr(ctx_class, "_forward_cls", None)
    info = getattr(forward_class, "_lazy_backward_info", None)
    graph = getattr(getattr(info, "bw_module", None), "graph", None)
    if not isinstance(graph, torch.fx.Graph):
        return []
    uses = []
    for node in graph.nodes:
        if node.op != "placeholder" or node.name.startswith("tangents"):
            break
        if not isinstance(node.meta.get("val"), torch.Tensor):
            continue
        trace = ""
        for user in node.users:
            trace = user.meta.get("stack_trace") or ""
            if trace:
                break
        uses.append(trace if isinstance(trace, str) else "")
    return uses if any(uses) else []
