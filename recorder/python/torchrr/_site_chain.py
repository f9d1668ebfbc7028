"""Runs the sitecustomize a torchrr sitecustomize hides, as site.py would have run it.

torchrr puts a directory of its own first on PYTHONPATH so that its sitecustomize runs
(_sitecustomize/ for ``torchrr record``, _fix_grads/ for ``torchrr fix --check``'s gradient
runs); the user's or the distribution's sitecustomize, later on sys.path, must run all the same.
Each of them loads this file by its path, without importing the torchrr package, whose import
would load the recorder before the program's torch.
"""
import importlib.machinery
import importlib.util
import os
import sys


def run_next_sitecustomize(here: str) -> None:
    """Runs the first sitecustomize on sys.path outside `here`; an error in it is reported as
    site.py reports one, and the program goes on."""
    def is_here(entry):
        try:
            return os.path.samefile(entry or os.getcwd(), here)
        except OSError:
            return False

    path = [entry for entry in sys.path if not is_here(entry)]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as error:  # site.py's behaviour: report and go on.
        sys.stderr.write(f"Error in sitecustomize ({spec.origin}); set PYTHONVERBOSE for "
                         f"traceback:\n{type(error).__name__}: {error}\n")

