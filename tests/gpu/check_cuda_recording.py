#!/usr/bin/env python3
"""torchrr on CUDA, checked against the same program on the CPU (tests/gpu/run.sh runs this).

1. An in-place bug (sigmoid's saved output multiplied in place) recorded on CUDA and on the CPU
   replays to the same verdict: kind, culprit and victim lines, node, versions.
2. The CUDA trace has the GPU's work: CUDA tensors (device cuda:0), backward run on the engine's
   device thread, and CUPTI kernels attributed to the ops that launched them (the sigmoid's
   kernel to aten::sigmoid). Without CUPTI (refused, missing) the check says so and skips this.
3. --verify-saved on CUDA: a write into a saved tensor by a raw kernel outside PyTorch's ops (CuPy,
   on the tensor's memory through __cuda_array_interface__) is a `silent` violation found by
   fingerprint, with that kernel among the candidates; without CuPy, a write through a DLPack
   alias (an op on another storage) stands in.
4. A CUDA trace replays on a machine without a GPU: the replay runs with CUDA_VISIBLE_DEVICES="".
5. Mixed precision: a short training loop under autocast (fp16 and bf16 on CUDA) with a GradScaler.
   Without a bug it reports nothing (autocast's cast copies, the scaler's in-place unscale and
   inf checks, the optimizer's step are legal); with an activation scaled in place it gives the
   verdict that the same loop under bf16 autocast on the CPU gives. Without CUDA
   (TORCHRR_GPU_DRY_RUN=1) the CPU half runs alone.

Prints one PASS/FAIL line per check; exit status 1 when any failed. Usage: check_cuda_recording.py
"""
import json
import os
import subprocess
import sys
import tempfile

import torch

import torchrr
from torchrr import _native

FAILED = []


def check(name, ok, why=""):
    print(("PASS " if ok else "FAIL ") + name + ("" if ok else f": {why}"), flush=True)
    if not ok:
        FAILED.append(name)


def program(device):
    x = torch.randn(64, 64, device=device, requires_grad=True)
    y = torch.sigmoid(x)  # VICTIM
    y.mul_(2)  # CULPRIT
    y.sum().backward()


def amp_loop(device, dtype, bug):
    """Two steps of a small model under autocast with a GradScaler; with `bug`, the second step
    scales an activation that sigmoid saved."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 1)).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler(device)
    x = torch.randn(32, 64, device=device)
    for step in range(2):
        with torch.autocast(device, dtype=dtype):
            h = torch.sigmoid(model[0](x))  # AMP_VICTIM
            if bug and step == 1:
                h.mul_(2)  # AMP_CULPRIT
            loss = model[1](h).float().pow(2).mean()
        optimizer.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()


def check_amp(tmp, device, dtypes, want=None):
    """Checks amp_loop on `device` with each dtype; returns the buggy loop's verdict."""
    for dtype in dtypes:
        name = f"{device} {str(dtype).replace('torch.', '')} autocast + GradScaler"
        clean = os.path.join(tmp, f"amp_clean_{device}_{dtype}.trr")
        error = record(clean, amp_loop, device, dtype, False)
        report = torchrr.replay(clean)
        check(f"{name}: a clean loop reports nothing", error is None and not report.violations,
              error or report.raw.get("violations"))
        buggy = os.path.join(tmp, f"amp_bug_{device}_{dtype}.trr")
        error = record(buggy, amp_loop, device, dtype, True)
        got = verdict(torchrr.replay(buggy))
        if want is None:
            want = ("version", None, lines("AMP_CULPRIT")[0], lines("AMP_VICTIM")[0],
                    "SigmoidBackward0", 0, 1, True)
        check(f"{name}: an activation scaled in place", bool(error) and got == want,
              f"{got} != {want} ({error!r})")
    return want


def lines(marker):
    with open(__file__) as f:
        return [i for i, text in enumerate(f, 1) if text.rstrip().endswith("# " + marker)]


def record(path, fn, *args, **options):
    try:
        with torchrr.record(path, native_stacks=False, **options):
            fn(*args)
    except RuntimeError as error:
        return str(error)
    return None


def verdict(report):
    if not report.violations:
        return None
    v = report.violations[0]
    where = lambda op: (op.user_frame.line if op and op.user_frame else None)
    return (v.kind, v.evidence, where(v.culprit), where(v.victim), v.backward_node.name,
            v.saved_version, v.current_version, v.pytorch_raised)


def records(path):
    out = subprocess.run([_native.cli_path(), "dump", "--json", path], capture_output=True,
                         text=True, check=True).stdout
    return [json.loads(line) for line in out.splitlines()]


# A raw write into a saved CUDA tensor (a CuPy kernel: no op, no version bump), for
# `torchrr record --locate-write`.
LOCATE_PROGRAM = """\
import cupy
import torch
x = torch.randn(1 << 16, device="cuda", requires_grad=True)
y = torch.sigmoid(x)
cupy.asarray(y.detach()).__imul__(0.5)  # WRITE
torch.cuda.synchronize()
y.sum().backward()
"""


def check_locate_write(tmp):
    """--locate-write on CUDA: the second run hashes the watched bytes on the device at every
    line and names the line of the write (LOCATE_PROGRAM's WRITE line)."""
    try:
        import cupy  # noqa: F401
    except ImportError:
        print("SKIP --locate-write on CUDA: no CuPy to write outside PyTorch's ops")
        return
    line = next(i for i, text in enumerate(LOCATE_PROGRAM.splitlines(), 1) if "# WRITE" in text)
    script = os.path.join(tmp, "locate.py")
    with open(script, "w") as f:
        f.write(LOCATE_PROGRAM)
    first, second = os.path.join(tmp, "locate1.trr"), os.path.join(tmp, "locate2.trr")
    cli = _native.cli_path()
    subprocess.run([cli, "record", "--verify-saved", "--quiet", "-o", first, "--", sys.executable,
                    script], capture_output=True, text=True, timeout=300)
    v = torchrr.replay(first).violations
    if not v or v[0].evidence != "fingerprint":
        print(f"SKIP --locate-write on CUDA: the write is not one by fingerprint here: "
              f"{[(x.kind, x.evidence) for x in v]}")
        return
    proc = subprocess.run([cli, "record", "--locate-write", first, "--quiet", "-o", second, "--",
                           sys.executable, script], capture_output=True, text=True, timeout=300)
    check("--locate-write names the line of a raw write on CUDA",
          f"locate.py:{line} in <module>" in proc.stderr, proc.stderr[-2000:])


def main():
    tmp = tempfile.mkdtemp(prefix="torchrr_gpu_")
    if not torch.cuda.is_available():
        if os.environ.get("TORCHRR_GPU_DRY_RUN") != "1":
            print("SKIP no CUDA device")
            return 0
        print("dry run: no CUDA device; the CPU's mixed-precision checks only")
        check_amp(tmp, "cpu", [torch.bfloat16])
        print(f"{'FAILED: ' + ', '.join(FAILED) if FAILED else 'all passed'}")
        return 1 if FAILED else 0
    cuda_trace, cpu_trace = os.path.join(tmp, "cuda.trr"), os.path.join(tmp, "cpu.trr")
    cuda_error = record(cuda_trace, program, "cuda")
    cpu_error = record(cpu_trace, program, "cpu")
    check("PyTorch raises on both devices", bool(cuda_error) and bool(cpu_error),
          f"cuda={cuda_error!r} cpu={cpu_error!r}")
    cuda_report, cpu_report = torchrr.replay(cuda_trace), torchrr.replay(cpu_trace)
    want = ("version", None, lines("CULPRIT")[0], lines("VICTIM")[0], "SigmoidBackward0", 0, 1,
            True)
    check("CPU verdict", verdict(cpu_report) == want, f"{verdict(cpu_report)} != {want}")
    check("CUDA verdict equals the CPU's", verdict(cuda_report) == verdict(cpu_report),
          f"{verdict(cuda_report)} != {verdict(cpu_report)}")
    check("CUDA tensors recorded on cuda:0",
          cuda_report.violations and cuda_report.violations[0].tensor.device == "cuda:0",
          cuda_report.violations[0].tensor.device if cuda_report.violations else "no violation")

    recs = records(cuda_trace)
    strings = {r["id"]: r["text"] for r in recs if r["kind"] == "string"}
    ops = {r["op"]: r for r in recs if r["kind"] == "op"}
    kernels = [r for r in recs if r["kind"] == "cuda_kernel"]
    execs = [r for r in recs if r["kind"] == "node_exec"]
    exec_threads = {ops[e["op"]]["thread"] for e in execs if e["op"] in ops}
    main_thread = next(r["thread"] for r in ops.values() if r["parent"] == 0)
    check("backward ran on autograd's device thread", exec_threads and
          main_thread not in exec_threads, f"exec threads {exec_threads}, main {main_thread}")
    if not kernels:
        print("SKIP CUPTI kernels: none recorded (CUPTI unavailable or refused: see the warning "
              "above)")
    else:
        def ancestors(op):
            seen = []
            while op in ops and len(seen) < 64:
                seen.append(strings.get(ops[op]["name"], "?"))
                op = ops[op]["parent"]
            return seen
        sigmoid = [k for k in kernels if "aten::sigmoid" in ancestors(k["op"])]
        attributed = [k for k in kernels if k["op"] != 0]
        check("CUPTI kernels recorded with grid, block and times",
              all(k["end_ns"] >= k["start_ns"] > 0 and k["grid"][0] > 0 for k in kernels),
              json.dumps(kernels[:2]))
        check("the sigmoid's kernel is attributed to aten::sigmoid", bool(sigmoid),
              [(strings.get(k["name"]), ancestors(k["op"])[:2]) for k in kernels[:8]])
        check("most kernels are attributed to an op", len(attributed) >= 0.8 * len(kernels),
              f"{len(attributed)} of {len(kernels)}")

    # --verify-saved: a raw kernel outside any op writes into the saved bytes.
    def silent_program():
        x = torch.randn(1 << 20, device="cuda", requires_grad=True)
        y = torch.sigmoid(x)
        try:
            import cupy
            cupy.asarray(y.detach()).__imul__(0.5)  # A CuPy kernel: no op, no version bump.
            writer = "cupy"
        except ImportError:
            torch.from_dlpack(y.detach()).mul_(0.5)
            writer = "dlpack"
        torch.cuda.synchronize()
        y.sum().backward()
        return writer

    silent_trace = os.path.join(tmp, "silent.trr")
    writer = []
    record(silent_trace, lambda: writer.append(silent_program()), verify_saved=True)
    report = torchrr.replay(silent_trace)
    v = report.violations[0] if report.violations else None
    check(f"--verify-saved: a {writer[:1]} write on CUDA is silent by fingerprint",
          v is not None and (v.kind, v.evidence) == ("silent", "fingerprint"),
          report.raw.get("violations"))
    if v is not None and writer[:1] == ["cupy"]:
        if not any(r["kind"] == "cuda_kernel" for r in records(silent_trace)):
            print("SKIP the CuPy kernel as a candidate: no CUPTI kernels recorded")
        else:
            check("the CuPy kernel is a candidate (launched outside any op)", bool(v.kernels),
                  v.raw.get("kernels"))

    none_trace = os.path.join(tmp, "none.trr")

    def clean():
        x = torch.randn(4096, device="cuda", requires_grad=True)
        (torch.sigmoid(x) * x).sum().backward()
    record(none_trace, clean, verify_saved=True)
    check("--verify-saved: a clean CUDA step reports nothing",
          torchrr.replay(none_trace).violations == [], "violations found")

    check_locate_write(tmp)

    cpu_amp = check_amp(tmp, "cpu", [torch.bfloat16])
    check_amp(tmp, "cuda", [torch.float16, torch.bfloat16], want=cpu_amp)

    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    replay = subprocess.run([_native.cli_path(), "replay", "--json", cuda_trace],
                            capture_output=True, text=True, env=env)
    check("a CUDA trace replays without a GPU", replay.returncode == 1 and
          json.loads(replay.stdout)["violations"], replay.stderr[-300:])
    print(f"{'FAILED: ' + ', '.join(FAILED) if FAILED else 'all passed'}")
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
