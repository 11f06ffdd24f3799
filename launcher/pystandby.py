# gotrain's Python standby (launcher/pystandby.go). The agent runs it as
#
#   PYTHON [the program's interpreter options] -c THIS FD DEVICE PRELOAD
#
# with a rank-less standby environment: FD is one end of a socket pair
# (JSON lines), DEVICE the CUDA device index of the slot's GPU (-1: none),
# PRELOAD the --standby-preload modules (comma-separated). It imports torch,
# torch.distributed and PRELOAD, initialises CUDA on DEVICE, says
# {"ready": ...} (or {"error": ...} and waits to be killed) and waits for
# the rank: {"env": [...], "cwd": ..., "path"|"module": ..., "args": [...]}.
# Then it becomes the program as `python SCRIPT ARGS` or `python -m MODULE
# ARGS` would run it, in this interpreter's own __main__ module.
#
# Everything lives in one function, so that __main__'s namespace holds
# nothing of the bootstrap when the program runs in it. Standard library
# only.


def _gotrain_standby():
    import json
    import os
    import signal
    import socket
    import sys

    fd, device, preload = int(sys.argv[1]), int(sys.argv[2]), [m for m in sys.argv[3].split(",") if m]
    os.set_inheritable(fd, False)
    handlers = {}
    for sig in signal.valid_signals():
        try:
            handlers[sig] = signal.getsignal(sig)
        except (OSError, ValueError):
            pass
    conn = socket.socket(fileno=fd)
    lines = conn.makefile("rb")

    def say(**msg):
        conn.sendall((json.dumps(msg) + "\n").encode())

    def linger(code):
        # The agent kills us (or closes the socket) once it has read why.
        try:
            lines.read()
        finally:
            os._exit(code)

    what = "import torch"
    try:
        import importlib
        import time

        t0 = time.monotonic()
        import torch
        import torch.distributed

        for mod in preload:
            what = "import %s (--standby-preload)" % mod
            importlib.import_module(mod)
        if device >= 0:
            what = "initialise CUDA device %d" % device
            # An allocation on the device makes its primary context without
            # making it the current device: a program that never calls
            # torch.cuda.set_device still starts on device 0, as when fresh.
            torch.empty(1, device=torch.device("cuda", device))
            torch.cuda.synchronize(device)
        say(ready=True, pid=os.getpid(), torch=torch.__version__, warm_s=round(time.monotonic() - t0, 3))
    except BaseException as e:
        msg = "%s: %s: %s" % (what, type(e).__name__, e)
        try:
            say(error=msg)
        except OSError:
            os._exit(1)
        linger(1)
    del torch, importlib, time

    line = lines.readline()
    if not line:
        os._exit(0)  # the agent let us go
    job = json.loads(line)
    lines.close()
    conn.close()

    tag = os.environ.get("GOTRAIN_SUPERVISE_TAG")
    env = dict(kv.split("=", 1) for kv in job["env"] if "=" in kv)
    if tag is not None:
        env["GOTRAIN_SUPERVISE_TAG"] = tag
    os.environ.clear()
    os.environ.update(env)
    os.chdir(job["cwd"])
    for sig, h in handlers.items():
        if h is not None and signal.getsignal(sig) is not h:
            try:
                signal.signal(sig, h)
            except (OSError, ValueError):
                pass
    sys.stdout.flush()
    sys.stderr.flush()

    safe = getattr(sys.flags, "safe_path", False)
    main = sys.modules["__main__"]
    g = main.__dict__
    g.pop("_gotrain_standby", None)
    if "module" in job:
        import runpy

        sys.argv = ["-m"] + job["args"]
        if not safe:
            sys.path[0] = os.getcwd()
        run = lambda: runpy._run_module_as_main(job["module"], alter_argv=True)
    else:
        import importlib.machinery
        import io

        path = job["path"]
        sys.argv = [path] + job["args"]
        try:
            with io.open_code(path) as f:
                source = f.read()
        except OSError as e:
            sys.stderr.write("%s: can't open file %r: [Errno %d] %s\n" % (sys.executable, path, e.errno, e.strerror))
            sys.exit(2)
        full = os.path.abspath(path)
        if not safe:
            sys.path[0] = os.path.dirname(os.path.realpath(path))
        code = compile(source, path, "exec", dont_inherit=True)
        builtins = g["__builtins__"]
        g.clear()
        g.update(__name__="__main__", __doc__=None, __package__=None, __spec__=None, __file__=full,
                 __cached__=None, __builtins__=builtins,
                 __loader__=importlib.machinery.SourceFileLoader("__main__", full))
        run = lambda: exec(code, g)
    try:
        run()
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as e:
        # As a fresh interpreter reports it: the program's frames only.
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename == "<string>":
            tb = tb.tb_next
        sys.excepthook(type(e), e.with_traceback(tb), tb)
        sys.exit(1)


_gotrain_standby()
