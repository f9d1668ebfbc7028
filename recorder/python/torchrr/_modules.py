"""Which nn.Module each recorded op ran under (OpRecord.module, format/SPEC.md "Modules").

A report that says only ``return self.body(x)`` for culprit and victim does not tell which of 24
decoder layers, or which child of an ``nn.Sequential``, ran the op. While recording, global forward
pre- and post-hooks keep, per thread, the modules whose forward is running, and hand the recorder
the innermost one's path and class (``layers.1.mlp.act_fn (SiLU)``), which it stamps on the ops
that start under it.

The path is the one ``named_modules()`` of the outermost running module gives, found once per
(parent, child) pair: a child reached through a container that runs no forward of its own
(``nn.ModuleList``) is looked up among the parent's descendants. Inside a torch.compile'd region
the hooks do nothing (dynamo traces them as no-ops), so compiled graphs are unchanged.
"""
from __future__ import annotations

import threading
import warnings

from . import _native

_local = threading.local()
_lock = threading.Lock()
# Hook handles while installed; the generation tells a thread's stack from a previous recording.
_handles: list = []
_generation = 0
# (id(parent), id(child)) -> the child's name under the parent, "" when not found. Keyed by ids:
# modules live as long as the model, and a stale pair only misnames.
_names: dict = {}
_MAX_NAMES = 1 << 16
# torch warns at every call of a torch.compile'd module while global module hooks exist (they
# fire once more for its wrapper): these are torchrr's, so the warning is not the program's.
_COMPILE_WARNING = r"Using `torch.compile\(module\)` when there are global hooks on modules"
_filter: list = []


def _stack() -> list:
    """This thread's running modules, outermost first (_entry)."""
    if getattr(_local, "generation", None) != _generation:
        _local.generation = _generation
        _local.stack = []
    return _local.stack


def _name_under(parent, child) -> str:
    key = (id(parent), id(child))
    name = _names.get(key)
    if name is None:
        name = ""
        for candidate, module in parent.named_modules(remove_duplicate=False):
            if module is child and candidate:
                name = candidate
                break
        if len(_names) >= _MAX_NAMES:
            _names.clear()
        _names[key] = name
    return name


def _entry(stack: list, module) -> tuple:
    """The stack entry of `module` called from the innermost running one: (module, its path from
    the outermost, its text for the recorder)."""
    # torch.compile's wrapper stands for the module it compiled.
    cls = type(getattr(module, "_orig_mod", module)).__name__
    name = _name_under(stack[-1][0], module) if stack else ""
    if not name:  # The outermost, or called by a module that does not own it.
        return module, "", f"({cls})".encode()
    parent_path = stack[-1][1]
    path = f"{parent_path}.{name}" if parent_path else name
    return module, path, f"{path} ({cls})".encode()


def _compiling() -> bool:
    return _is_compiling is not None and _is_compiling()


_is_compiling = None  # torch.compiler.is_compiling, once installed.


def _pre_hook(module, args):
    if _compiling():
        return None
    try:
        stack = _stack()
        entry = _entry(stack, module)
        stack.append(entry)
        lib = _native.loaded()
        if lib is not None:
            lib.torchrr_set_module(entry[2])
    except Exception:  # Never break the model's forward: the ops are then named by no module.
        pass
    return None


def _post_hook(module, args, output):
    if _compiling():
        return None
    try:
        stack = _stack()
        # A forward that raised left its children's entries (with always_call, the post-hooks of
        # the modules that raised run; of those it never reached, not).
        for i in range(len(stack) - 1, -1, -1):
            if stack[i][0] is module:
                del stack[i:]
                lib = _native.loaded()
                if lib is not None:
                    lib.torchrr_set_module(stack[-1][2] if stack else None)
                break
    except Exception:
        pass
    return None


def install() -> None:
    """Starts naming modules (on start()). Idempotent; imports torch."""
    global _generation, _is_compiling
    import torch
    from torch.nn.modules import module as nn_module
    _is_compiling = torch.compiler.is_compiling
    with _lock:
        if _handles:
            return
        _generation += 1
        _names.clear()
        _handles.append(nn_module.register_module_forward_pre_hook(_pre_hook))
        _handles.append(nn_module.register_module_forward_hook(_post_hook, always_call=True))
        warnings.filterwarnings("ignore", message=_COMPILE_WARNING, category=UserWarning)
        _filter.append(warnings.filters[0])


def uninstall() -> None:
    """Stops naming modules (on stop())."""
    with _lock:
        for handle in _handles:
            handle.remove()
        _handles.clear()
        for entry in _filter:
            try:
                warnings.filters.remove(entry)
            except ValueError:  # The program reset the filters.
                pass
        _filter.clear()
        # What filterwarnings() does after a change, so that registries forget the ignored ones.
        getattr(warnings, "_filters_mutated", lambda: None)()
        lib = _native.loaded()
    if lib is not None:
        lib.torchrr_set_module(None)
