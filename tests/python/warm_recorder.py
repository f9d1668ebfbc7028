"""Records Python scripts as `torchrr record -- python SCRIPT` does, from a process that has
imported torch once: each script runs in a forked child of it, which sets the environment that
`torchrr record` would give the program, starts the recorder the way torchrr's sitecustomize does
when torch is already imported, and runs the script as `python SCRIPT` would (`__main__`, its
directory first on sys.path, an uncaught exception printed and exit status 1, atexit handlers).

For the tests whose subject is what a recording says, not how `torchrr record` starts a process:
importing torch costs about 2 s of CPU a process, most of what such a test takes. The process
boundary itself (the CLI, the sitecustomize's import hook, launchers, signals, forks) is tested
through `conftest.record`, which runs the real command.

Run as a program, this file is the warm process: it reads one request a line on stdin (JSON:
argv, env, cwd, stdout and stderr paths, timeout) and answers each with {"returncode": N} once
the child has ended.
"""
import json
import os
import sys


def _run_child(request):
    """In the forked child: becomes `python SCRIPT ARGS...` under torchrr's recording; never
    returns."""
    code = 1
    try:
        import signal

        # Past its timeout the child ends as a killed one would (-SIGALRM).
        signal.alarm(max(1, int(request["timeout"])))
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
            out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(out, fd)
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        script = request["argv"][0]
        sys.argv = list(request["argv"])
        sys.path[0] = os.path.dirname(os.path.abspath(script))

        import sitecustomize  # torchrr's, first on PYTHONPATH: what starts a recording.

        if sitecustomize._should_record():
            sitecustomize._start_recording()
        import runpy

        try:
            runpy.run_path(script, run_name="__main__")
            code = 0
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
            if not isinstance(exit_.code, (int, type(None))):
                sys.stderr.write(f"{exit_.code}\n")
        except BaseException:
            sys.excepthook(*sys.exc_info())
            code = 1
        import threading

        threading._shutdown()  # As at interpreter exit: non-daemon threads are joined first.
        import atexit

        atexit._run_exitfuncs()
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code & 0xFF)


def serve():
    protocol_in = sys.stdin
    protocol_out = os.fdopen(os.dup(1), "w")
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)  # Nothing but answers on the protocol's stream.
    import torch  # noqa: F401  The point of this process: imported once, before any fork.

    protocol_out.write(json.dumps({"ready": True}) + "\n")
    protocol_out.flush()
    for line in protocol_in:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            protocol_out.close()
            _run_child(request)
        _, status = os.waitpid(pid, 0)
        protocol_out.write(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}) + "\n")
        protocol_out.flush()


if __name__ == "__main__":
    serve()
