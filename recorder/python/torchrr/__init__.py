"""torchrr: record every tensor op of a PyTorch training step, then find which op on which line
modified a tensor autograd had saved (the culprit behind "one of the variables needed for
gradient computation has been modified by an inplace operation").

    import torchrr
    with torchrr.record("step.trr"):
        train_step()
    for v in torchrr.replay("step.trr").violations:
        print(v.culprit.op, v.culprit.user_frame, "broke", v.victim.op, v.victim.user_frame)

Importing torchrr does not import torch; record()/start() do (before loading the recorder, so it
binds to the same libtorch). An unchanged script is recorded with ``torchrr record -- python
script.py`` (see _sitecustomize/sitecustomize.py).
"""
from ._recording import Recording, ops_recorded, record, record_error, recording, start, stop
from ._report import (BackwardNode, Frame, Op, ReplayError, Report, Tensor, Violation, replay)

__all__ = [
    "BackwardNode", "Frame", "Op", "Recording", "ReplayError", "Report", "Tensor", "Violation",
    "ops_recorded", "record", "record_error", "recording", "replay", "start", "stop",
]
