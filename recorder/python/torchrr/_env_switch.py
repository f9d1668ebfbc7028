"""A switch among the TORCHRR_* variables, read as the recorder reads it (ParseSwitch in
recorder/src/options/recording_options.cc): on for exactly 1, true, yes or on. For the Python
code that decides something from one beside the recorder, so that both agree on every value.
Standard library only: the sitecustomize loads this file by its path, before torch.
"""
import os

ON = ("1", "true", "yes", "on")


def switch_on(name: str) -> bool:
    return os.environ.get(name, "") in ON
