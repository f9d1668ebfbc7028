"""The ``torchrr`` command of a pip install: runs the native executable this package carries
(``bin/torchrr``, found as _native.cli_path says), with the same arguments and exit status."""
from __future__ import annotations

import os
import sys

from . import _native


def main() -> None:
    try:
        cli = _native.cli_path()
    except RuntimeError as error:
        sys.stderr.write(f"{error}\n")
        sys.exit(7)  # `torchrr --help`'s "other error".
    if os.path.realpath(cli) == os.path.realpath(sys.argv[0]):  # Found itself on PATH.
        sys.stderr.write("torchrr: the torchrr executable is missing from this install: "
                         "reinstall torchrr\n")
        sys.exit(7)
    # exec, not a child: signals, the terminal and the exit status stay the program's own.
    os.execv(cli, [cli, *sys.argv[1:]])


if __name__ == "__main__":
    main()
