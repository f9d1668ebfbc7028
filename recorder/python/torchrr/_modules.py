"""Which nn.Module each recorded op ran under (OpRecord.module_path, format/SPEC.md "Modules").

A report that says only ``return self.body(x)`` for culprit and victim does not tell which of 24
decoder layers, or which child of an ``nn.Sequential``, ran the op. While recording, global forward
pre- and post-hooks keep, per thread, the modules whose forward is running, and hand the recorder
the innermost one's path and class (``layers.1.mlp.act_fn (SiLU)``), which it stamps on the ops
that start under it.

The path is the one ``named_modules()`` of the outermost running module gives, found once per
(parent, child) pair: a child reached through a container that runs no forward of its own
(``nn.ModuleList``) is looked up among the parent's descendants; an outermost one called from
another method of a module that owns it (Lightning's ``training_step``) is named under that module.
Inside a torch.compile'd region the hooks do nothing (dynamo traces them as no-ops), so compiled
graphs are unchanged.
"""
from __future__ import annotations

import sys
import threading
import warnings

from . import _native

_local = threading.local()
_lock = threading.Lock()
# Hook handles while installed; the generation tells a thread's stack from a previous recording.
_handles: list = []
_generation = 0
# (id(module), its caller's text) -> (its path, its text): a module call costs two dict lookups,
# not a walk of the parent's modules. Keyed by id: modules live as long as the model, and a stale
# entry only misnames.
_entries: dict = {}
_MAX_ENTRIES = 1 << 16
# id(module) -> the entry of its latest call under another module.
_paths: dict = {}
# torch warns at every call of a torch.compile'd module while global module hooks exist (they
# fire once more for its wrapper): these are torchrr's, so the warning is not the program's.
_COMPILE_WARNING = r"Using `torch.compile\(module\)` when there are global hooks on modules"
_filter: list = []


def _stack() -> list:
    """This thread's running modules, outermost first: (module, path, text) entries."""
    state = _local.__dict__
    if state.get("generation") != _generation:
        state["generation"] = _generation
        state["stack"] = []
    return state["stack"]


def _name_under(parent, child) -> str:
    """`child`'s name among `parent`'s descendants ("layers.0" through a ModuleList), "" when it is
    none of them."""
    for candidate, module in parent.named_modules(remove_duplicate=False):
        if module is child and candidate:
            return candidate
    return ""


def _name_under_caller(module) -> str:
    """`module`'s name under the module whose method called it, when that method is not a forward
    (Lightning's ``training_step`` calling ``self.net``): the path a user reads in their own code
    (``net.2``), where the outermost running module alone would give ``2``. "" when the caller is no
    module's method or does not own it."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename in _HOOK_FILES:
        frame = frame.f_back
    if frame is None or frame.f_code.co_argcount == 0 or frame.f_code.co_varnames[0] != "self":
        return ""
    owner = frame.f_locals.get("self")
    if owner is module or not isinstance(owner, _module_class):
        return ""
    return _name_under(owner, module)


def _entry(stack: list, module) -> tuple:
    """`module`'s path from the outermost running module and its text for the recorder, called from
    the innermost running one; cached per (module, caller's text)."""
    parent_text = stack[-1][2] if stack else None
    key = (id(module), parent_text)
    entry = _entries.get(key)
    if entry is not None:
        return entry
    # torch.compile's wrapper stands for the module it compiled.
    inner = module.__dict__.get("_modules", {}).get("_orig_mod", module)
    cls = type(inner).__name__
    name = _name_under(stack[-1][0], module) if stack else ""
    if not name and not stack and id(module) in _paths:
        # Called with no module running, after a call under its model: activation
        # checkpointing's recomputation of a layer, run by backward. Named as in the forward.
        entry = _paths[id(module)]
    elif not name and not stack and (name := _name_under_caller(module)):
        entry = (name, f"{name} ({cls})".encode())
    elif not name:  # The outermost, or called by a module that does not own it.
        entry = ("", f"({cls})".encode())
    else:
        parent_path = stack[-1][1]
        path = f"{parent_path}.{name}" if parent_path else name
        entry = (path, f"{path} ({cls})".encode())
        _paths[id(module)] = entry
    if len(_entries) >= _MAX_ENTRIES:
        _entries.clear()
        _paths.clear()
    _entries[key] = entry
    return entry


def _pre_hook(module, args):
    if _is_compiling():
        return None
    try:
        stack = _stack()
        path, text = _entry(stack, module)
        stack.append((module, path, text))
        _set_module(text)
    except Exception:  # Never break the model's forward: the ops are then named by no module.
        pass
    return None


def _post_hook(module, args, output):
    if _is_compiling():
        return None
    try:
        stack = _stack()
        if stack and stack[-1][0] is module:
            stack.pop()
        else:
            # A forward that raised left its children's entries (with always_call, the
            # post-hooks of the modules that raised run; of those it never reached, not).
            for i in range(len(stack) - 1, -1, -1):
                if stack[i][0] is module:
                    del stack[i:]
                    break
            else:
                return None  # Its pre-hook ran before recording started.
        _set_module(stack[-1][2] if stack else None)
    except Exception:
        pass
    return None


def _no_module(text) -> None:
    pass


# While installed: torch.compiler.is_compiling, and the recorder's torchrr_set_module.
_is_compiling = None
_set_module = _no_module
# While installed: nn.Module, and the files of the frames between a module's caller and the hooks.
_module_class = type(None)
_HOOK_FILES: frozenset = frozenset()


def install() -> None:
    """Starts naming modules (on start()). Idempotent; imports torch."""
    global _generation, _is_compiling, _set_module, _module_class, _HOOK_FILES
    import torch
    from torch.nn.modules import module as nn_module
    lib = _native.library()
    with _lock:
        if _handles:
            return
        _is_compiling = torch.compiler.is_compiling
        _module_class = torch.nn.Module
        _HOOK_FILES = frozenset({_pre_hook.__code__.co_filename,
                                 nn_module.Module._call_impl.__code__.co_filename})
        _set_module = lib.torchrr_set_module
        _generation += 1
        _entries.clear()
        _paths.clear()
        _handles.append(nn_module.register_module_forward_pre_hook(_pre_hook))
        _handles.append(nn_module.register_module_forward_hook(_post_hook, always_call=True))
        warnings.filterwarnings("ignore", message=_COMPILE_WARNING, category=UserWarning)
        _filter.append(warnings.filters[0])


def uninstall() -> None:
    """Stops naming modules (on stop())."""
    global _set_module
    with _lock:
        _set_module = _no_module
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
