"""A full disk under `torchrr record`: the trace's file system fills up during the run (ENOSPC on
the writer thread). Recording stops with one warning, the program runs to its end and exits with
its own status, and the trace written so far reads back, every chunk that verifies kept.

The full file system is a small tmpfs mounted in a mount namespace of its own (`unshare`): as
root directly, otherwise in a user namespace where the caller maps to root. Where neither is
allowed (a container without the capability, user namespaces off) the test skips and says why.
"""
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

import torchrr
from conftest import cli, needs_build

pytestmark = needs_build

# 6,000 steps of 17 recorded ops: about 2 MiB of trace in chunks of 100 to 300 KiB (one each
# 500 ms, 16 MiB raw at most), where the file system holds 512 KiB.
TRAINING = textwrap.dedent("""\
    import sys, torch

    def step(w, i):
        x = torch.randn(32, 32)
        y = (x @ w).relu_()
        z = y.mul(i).add_(1)
        return z.sigmoid().sum()

    w = torch.randn(32, 32, requires_grad=True)
    for i in range(6000):
        step(w, i).backward()
    print("steps done", flush=True)
    sys.exit(3)  # The program's own status, which torchrr record must pass through.
    """)

TMPFS_BYTES = 512 << 10

# Runs in the new mount namespace: $1 the mount point, $2 where the trace is copied to (outside
# the namespace, which ends with this script), then torchrr's command line.
IN_NAMESPACE = textwrap.dedent("""\
    mount -t tmpfs -o size={size} tmpfs "$1" || exit 90
    mnt=$1; out=$2; shift 2
    "$@"
    rc=$?
    cp "$mnt/run.trr" "$out/run.trr"
    exit $rc
    """).format(size=TMPFS_BYTES)


def _namespace_prefix():
    """The unshare command line that lets this user mount a tmpfs, or pytest.skip with why."""
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("no unshare(1): cannot mount a small file system to fill")
    tried = []
    candidates = [[unshare, "--mount"]] if os.geteuid() == 0 else []
    candidates.append([unshare, "--user", "--map-root-user", "--mount"])
    for prefix in candidates:
        probe = subprocess.run([*prefix, "sh", "-c", "mount -t tmpfs -o size=4k tmpfs /mnt"],
                               capture_output=True, text=True, timeout=30)
        if probe.returncode == 0:
            return prefix
        tried.append(f"{' '.join(prefix[1:])}: {probe.stderr.strip() or probe.returncode}")
    pytest.skip("cannot mount a tmpfs in a mount namespace (" + "; ".join(tried) + ")")


def test_a_full_disk_stops_the_recording_not_the_program(tmp_path):
    prefix = _namespace_prefix()
    script = tmp_path / "train.py"
    script.write_text(TRAINING)
    mount_point = tmp_path / "small"
    mount_point.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for name in ("TORCHRR_OUTPUT", "TORCHRR_RECORDER_PID", "RANK"):
        env.pop(name, None)
    proc = subprocess.run(
        [*prefix, "sh", "-c", IN_NAMESPACE, "sh", str(mount_point), str(out),
         cli(), "record", "-o", str(mount_point / "run.trr"), "--", sys.executable, str(script)],
        capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode != 90, f"tmpfs mount failed: {proc.stderr}"

    assert proc.returncode == 3, f"exit {proc.returncode}, the program's is 3: {proc.stderr}"
    assert proc.stdout == "steps done\n", proc.stdout
    # One warning when the disk fills, then where what was kept is (every verb that writes says).
    lines = [line for line in proc.stderr.splitlines() if line.startswith("torchrr:")]
    warnings = [line for line in lines if line.startswith("torchrr: warning:")]
    assert len(warnings) == 1, proc.stderr
    assert "No space left on device" in warnings[0], warnings[0]
    assert "recording stopped" in warnings[0], warnings[0]
    assert len(lines) == 2 and lines[0] == warnings[0], proc.stderr
    assert lines[1].startswith(f"torchrr: wrote {mount_point / 'run.trr'} (the trace, "), lines[1]

    trace = out / "run.trr"
    assert 0 < trace.stat().st_size <= TMPFS_BYTES
    info = subprocess.run([cli(), "info", str(trace)], capture_output=True, text=True,
                          timeout=60)
    assert info.returncode == 4, f"info exit {info.returncode} (4: truncated): {info.stdout}"
    report = torchrr.replay(trace)
    assert report.trace.get("status") == "truncated", report.trace
    assert report.ops > 0  # The chunks written before the disk filled.
    assert report.violations == []
