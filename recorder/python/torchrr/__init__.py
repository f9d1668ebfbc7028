"""torchrr: record every tensor op of a PyTorch training step, then find which op on which line
modified a tensor autograd had saved (the culprit behind "one of the variables needed for
gradient computation has been modified by an inplace operation").

    import torchrr
    with torchrr.record("step.trr"):
        train_step()
    for v in torchrr.replay("step.trr").violations:
        print(v.culprit.op, v.culprit.user_frame, "broke", v.victim.op, v.victim.user_frame)

In IPython or Jupyter, ``%load_ext torchrr`` gives the ``%%torchrr`` cell magic, which records
a cell and shows the verdict below it (_ipython.py); torchrr.callbacks marks the steps of
transformers' and Lightning's trainers.

Importing torchrr does not import torch (nor IPython); record()/start() do (before loading the
recorder, so it binds to the same libtorch). An unchanged script is recorded with ``torchrr
record -- python script.py`` (see _sitecustomize/sitecustomize.py).

The recorder records only under the torch it was built against (``torchrr_build.json``); the
import warns (TorchVersionWarning) when the environment's torch is another, and record()/start()
refuse it. Replaying needs no torch.
"""
import warnings as _warnings

from . import _native
from ._recording import (Recording, flush, ops_recorded, options_in_effect, record,
                         record_error, recording, start, step, stop)
from ._report import (BackwardNode, Frame, FunctionContext, GradientCut, NonFinite, Op,
                      ReplayError, Report, Tensor, Violation, replay)

__all__ = [  # And __version__, read from the build when asked (__getattr__).
    "BackwardNode", "Frame", "FunctionContext", "GradientCut", "NonFinite", "Op", "Recording",
    "ReplayError", "Report", "Tensor",
    "TorchVersionWarning", "Violation", "flush", "ops_recorded", "options_in_effect", "record",
    "load_ipython_extension", "record_error", "recording", "replay", "start", "step", "stop",
]


def __getattr__(name: str):
    """``torchrr.__version__``: the version of the build this package uses (``torchrr
    --version``'s), read when first asked so that the import stays cheap."""
    if name == "__version__":
        value = _native.version()
        globals()["__version__"] = value
        return value
    raise AttributeError(f"module 'torchrr' has no attribute {name!r}")


def load_ipython_extension(ipython) -> None:
    """``%load_ext torchrr``: registers the ``%%torchrr`` cell magic (see _ipython.py)."""
    from ._ipython import load_ipython_extension as load

    load(ipython)


class TorchVersionWarning(UserWarning):
    """The environment's torch is not the one torchrr's recorder was built against, or is outside
    the versions torchrr supports: recording will be refused until torchrr is rebuilt."""


def _warn_on_torch_mismatch() -> None:
    problem = _native.installed_torch_problem()
    if problem:
        _warnings.warn(f"torchrr: {problem}", TorchVersionWarning, stacklevel=3)


_warn_on_torch_mismatch()
