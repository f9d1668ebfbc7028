#!/usr/bin/env bash
# Makes the build usable from the project's .venv: .venv/bin/torchrr is the CLI, and
# `import torchrr` finds the Python package (recorder/python) and the native libraries.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
ln -sfn "$PWD/$build/bin/torchrr" .venv/bin/torchrr
site=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
echo "$PWD/recorder/python" > "$site/torchrr.pth"
# Where the package finds the native build (the CLI, the recorder libraries).
echo "$PWD/$build" > recorder/python/torchrr/_build_dir.txt
