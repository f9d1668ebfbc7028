"""``torchrr record --locate-write EARLIER.trr -- python ...``: the line that wrote into a saved
tensor's bytes where no op ran (numpy, ctypes through ``data_ptr()``, an extension), found by
running the program again and watching those bytes.

EARLIER.trr's first silent violation found by fingerprint (``--verify-saved``: its bytes changed
between the save and the use, and no recorded op wrote them) names the victim: the line that
saved the tensor, its shape and dtype. In this run a default saved-tensors pack hook sees what
autograd saves on the main thread; the first tensor of that shape and dtype saved from the
victim's line is watched: its bytes' fingerprint is taken (kernels/fingerprint.h, on a CUDA
tensor's device and stream), and from then on a line tracer (``sys.settrace``, this thread)
takes it again at every line and return event until backward unpacks the tensor.
The first event that finds them changed names the line that ran just before it, which wrote them
or called what did, with its callers, on stderr. At exit, a run that never saved such a tensor,
or whose watched bytes did not change, says so.

A diagnostic run, not a recording to trust for other verdicts: the pack hook hands autograd the
tensor itself, so PyTorch checks no saved tensor's version in this run, and every line between
the save and the use pays for a hash of the watched bytes (on CUDA, a kernel and a wait for the
stream). A write from another thread is named by the line this thread was running.
"""
from __future__ import annotations

import atexit
import ctypes
import os
import sys
import traceback

_PREFIX = "torchrr: --locate-write:"


def _say(text: str) -> None:
    sys.stderr.write(f"{_PREFIX} {text}\n")


class _Watch:
    def __init__(self, violation):
        self.violation = violation
        frame = violation.victim.user_frame
        self.file = os.path.realpath(frame.file)
        self.line = frame.line
        self.shape = tuple(violation.tensor.shape)
        self.dtype = f"torch.{violation.tensor.dtype}"
        self.tensor = None
        self.ptr = 0
        self.size = 0
        self.device = -1
        self.before = 0
        self.lib = None
        self.last = None  # (file, line, function, frame) of the latest line event.
        self.found = False
        self.done = False

    def what(self) -> str:
        node = self.violation.backward_node.name if self.violation.backward_node else "a node"
        dims = ", ".join(str(d) for d in self.shape)
        return (f"the tensor {node} saved ({self.violation.tensor.dtype}[{dims}], saved at "
                f"{self.violation.victim.user_frame.file}:{self.line})")

    def matches(self, tensor) -> bool:
        if self.tensor is not None or self.done or tensor.device.type not in ("cpu", "cuda"):
            return False
        if tuple(tensor.shape) != self.shape or str(tensor.dtype) != self.dtype:
            return False
        frame = sys._getframe(2)
        while frame is not None:
            if frame.f_lineno == self.line and \
                    os.path.realpath(frame.f_code.co_filename) == self.file:
                return True
            frame = frame.f_back
        return False

    def start(self, tensor) -> None:
        from . import _native
        self.lib = _native.loaded()
        if self.lib is None:
            return
        self.tensor = tensor  # Kept alive: its memory must not be reused while watched.
        # The bytes from its first element to its last, gaps of a strided view included, as
        # --verify-saved hashes them.
        last = sum((size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride()))
        self.ptr = tensor.data_ptr()
        self.size = 0 if tensor.numel() == 0 else (last + 1) * tensor.element_size()
        self.device = tensor.device.index if tensor.device.type == "cuda" else -1
        if self.device is None:
            self.device = 0
        before = self.fingerprint()
        if before is None:
            _say(f"cannot read {self.what()}: nothing to locate")
            self.done = True
            return
        self.before = before
        # The frames already running get the tracer too: the write may come later in them.
        frame = sys._getframe(2)
        while frame is not None:
            if os.path.realpath(frame.f_code.co_filename) != _HERE:
                frame.f_trace = self.trace
                frame.f_trace_lines = True
            frame = frame.f_back
        sys.settrace(self.trace)

    def fingerprint(self):
        value = ctypes.c_uint64()
        if self.lib.torchrr_fingerprint(self.ptr, self.size, self.device, ctypes.byref(value)):
            return None
        return value.value

    def changed(self) -> bool:
        now = self.fingerprint()
        return now is not None and now != self.before

    def trace(self, frame, event, arg):
        if self.done:
            return None
        if os.path.realpath(frame.f_code.co_filename) == _HERE:
            return None
        if event in ("line", "return") and self.changed():
            self.report()
            return None
        if event == "line":
            self.last = (frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name, frame)
        return self.trace

    def report(self) -> None:
        self.done = self.found = True
        sys.settrace(None)
        if self.last is None:
            _say(f"{self.what()} changed before any line ran after its save")
            return
        file, line, function, frame = self.last
        lines = [f"{self.what()} changed while this line ran, between the save and backward's "
                 f"use: it wrote them, or called what did:",
                 f"  {file}:{line} in {function}"]
        code = _source_line(file, line)
        if code:
            lines.append(f"    {code}")
        callers = traceback.extract_stack(frame.f_back) if frame.f_back is not None else []
        for caller in reversed(callers[-8:]):
            lines.append(f"  called from {caller.filename}:{caller.lineno} in {caller.name}")
        _say("\n".join(lines))

    def stop(self) -> None:
        """Backward unpacked the tensor: what changes it after is not between save and use."""
        if not self.done:
            self.done = True
            sys.settrace(None)

    def at_exit(self) -> None:
        if self.found:
            return
        if self.tensor is None:
            _say(f"this run saved no tensor like {self.what()}: it did not run as the recorded "
                 "one did, and nothing was located")
        else:
            _say(f"{self.what()} did not change between its save and its use in this run: the "
                 "write did not happen again (a write that depends on data, timing or another "
                 "thread)")


_HERE = os.path.realpath(__file__)


def _source_line(file: str, line: int) -> str:
    import linecache
    return linecache.getline(file, line).strip()


def install(trace: str) -> bool:
    """Watches the first silent violation by fingerprint of `trace` in this run; False (with a
    line on stderr) when the trace has none or cannot be read. Imports torch."""
    from ._report import ReplayError, replay
    try:
        report = replay(trace)
    except (OSError, ReplayError) as error:
        _say(f"cannot read {trace}: {error}")
        return False
    targets = [v for v in report.violations
               if v.kind == "silent" and v.evidence == "fingerprint" and v.victim is not None
               and v.victim.user_frame is not None and v.tensor is not None]
    if not targets:
        _say(f"{trace} holds no write that no op made into a saved tensor (a silent violation "
             "with evidence fingerprint, which `torchrr record --verify-saved` finds): nothing "
             "to locate")
        return False
    watch = _Watch(targets[0])
    import torch

    def pack(tensor):
        if watch.matches(tensor):
            watch.start(tensor)
        return tensor

    def unpack(tensor):
        if tensor is watch.tensor:
            watch.stop()
        return tensor

    torch._C._autograd._push_saved_tensors_default_hooks(pack, unpack)
    atexit.register(watch.at_exit)
    _say(f"watching {watch.what()}")
    return True
