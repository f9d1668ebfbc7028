"""Trainer callbacks that mark torchrr's steps where the trainer's own optimizer steps begin.

Without marks the recorder takes each backward pass for a step (format/SPEC.md, Steps), so under
gradient accumulation a step is a micro-batch: ``--keep-last 2`` keeps half an optimizer step of
4 micro-batches, and the step numbers count micro-batches. These callbacks call torchrr.step() at
the start of each optimizer step as the trainer counts it, so the kept steps and their numbers
follow ``gradient_accumulation_steps`` / ``accumulate_grad_batches``::

    from torchrr.callbacks import TrainerStepCallback        # transformers' Trainer
    trainer = Trainer(..., callbacks=[TrainerStepCallback()])

    from torchrr.callbacks import LightningStepCallback      # Lightning's Trainer
    trainer = lightning.Trainer(..., callbacks=[LightningStepCallback()])

They mark the start of a step, not its end: torchrr.step() begins a step, and the ops before the
first mark (model setup) belong to no step. When nothing records (no ``torchrr record``, no
``torchrr.record()``), they do nothing. Importing this module imports neither transformers nor
Lightning: each class is made on first use from the library it serves.
"""
from __future__ import annotations

from . import _recording

__all__ = ["LightningStepCallback", "TrainerStepCallback"]

_made: dict = {}


def _trainer_step_callback() -> type:
    from transformers import TrainerCallback

    class TrainerStepCallback(TrainerCallback):
        """A transformers ``TrainerCallback`` that marks a torchrr step where each optimizer
        step begins: the Trainer calls ``on_step_begin`` before the first micro-batch of each
        ``gradient_accumulation_steps`` (its ``global_step`` counts the same steps)."""

        def on_step_begin(self, args, state, control, **kwargs):
            _recording.step()

    return TrainerStepCallback


def _lightning_step_callback() -> type:
    try:
        from lightning.pytorch import Callback
    except ImportError:  # The standalone package of the same trainer.
        from pytorch_lightning import Callback

    class LightningStepCallback(Callback):
        """A Lightning ``Callback`` that marks a torchrr step where each optimizer step begins:
        at the first batch of each run of ``trainer.accumulate_grad_batches``. The batch index
        starts again at 0 each epoch, where Lightning also starts a new accumulation (it steps
        on an epoch's last batch even when the run is short), so the marks follow its steps."""

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if batch_idx % max(1, int(trainer.accumulate_grad_batches)) == 0:
                _recording.step()

    return LightningStepCallback


_FACTORIES = {"TrainerStepCallback": _trainer_step_callback,
              "LightningStepCallback": _lightning_step_callback}


def __getattr__(name: str) -> type:
    """Makes TrainerStepCallback or LightningStepCallback on first access (importing
    transformers or Lightning then). Raises ImportError when that library is not installed."""
    factory = _FACTORIES.get(name)
    if factory is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if name not in _made:
        _made[name] = factory()
    return _made[name]
