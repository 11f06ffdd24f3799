# gotrain's Python standby (internal/launcher/pystandby.go). The agent runs it as
#
#   PYTHON [the program's interpreter options] -c THIS FD DEVICE PRELOAD
#
# with a rank-less standby environment: FD is one end of a socket pair
# (JSON lines), DEVICE the CUDA device index of the slot's GPU (-1: none),
# PRELOAD the --standby-preload modules (comma-separated). It imports torch,
# torch.distributed and PRELOAD, initialises CUDA on DEVICE, says
# {"ready": ...} (or {"error": ...} and waits to be killed) and waits for
# the rank: {"env": [...], "cwd": ..., "path"|"module": ..., "args": [...]}.
# Meanwhile the agent may send {"preload": [...], "seconds": S, "growth":
# BYTES}: the installed packages the job's first attempt imported (the
# torch hook's list), which it imports too, for at most S seconds and
# BYTES of RSS growth, skipping those that fail, and answers
# {"preloaded": [...], ...}.
# Then it becomes the program as `python SCRIPT ARGS` or `python -m MODULE
# ARGS` would run it, in this interpreter's own __main__ module.
#
# A standby-run rank must be what a fresh `python SCRIPT` would be (issue
# 26): __main__'s globals (with __annotations__), an absolute co_filename,
# sys.orig_argv and /proc/PID/cmdline (ps) of the fresh command line
# (followed by NULs where the bootstrap's longer one was),
# and the environment torch was imported under. A program that changes an
# import-time variable before its first `import torch`: OMP_NUM_THREADS and
# MKL_NUM_THREADS are applied again (torch.set_num_threads); any other
# (CUDA_*, TORCH_*, PYTORCH_*, NCCL_*, OMP_*, MKL_*, KMP_*) makes the rank
# start over in a fresh interpreter (exec, same pid), with one line saying
# why. A rank other than 0 waits for rank 0's TCPStore to listen before it
# connects (torch's client would sleep 1 s on a refused connection).
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
        import_env = dict(os.environ)  # what torch was imported under
        say(ready=True, pid=os.getpid(), torch=torch.__version__, warm_s=round(time.monotonic() - t0, 3))
    except BaseException as e:
        msg = "%s: %s: %s" % (what, type(e).__name__, e)
        try:
            say(error=msg)
        except OSError:
            os._exit(1)
        linger(1)
    del torch, importlib, time

    while True:
        line = lines.readline()
        if not line:
            os._exit(0)  # the agent let us go
        job = json.loads(line)
        if "preload" not in job:
            break
        learned = _preload(job["preload"], float(job.get("seconds", 60)), int(job.get("growth", 2 << 30)))
        preload = preload + [m for m in learned if m not in preload]
        say(preloaded=learned, tried=len(job["preload"]))
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

    # The fresh command line: the interpreter and its options as the
    # agent started us, then the program's, without the bootstrap.
    opts = sys.orig_argv[1:sys.orig_argv.index("-c")] if "-c" in sys.orig_argv else []
    prog = ["-m", job["module"]] if "module" in job else [job["path"]]
    fresh_argv = sys.orig_argv[:1] + opts + prog + job["args"]
    sys.orig_argv = list(fresh_argv)
    _retitle(fresh_argv)
    if env.get("GOTRAIN_STANDBY_STORE_WAIT") != "off":  # off: for bench/torch_restart.sh's comparison
        _store_waits_for_rank0()
    _watch_import_env(import_env, dict(env), preload, fresh_argv)

    safe = getattr(sys.flags, "safe_path", False)
    main = sys.modules["__main__"]
    g = main.__dict__
    for name in ("_gotrain_standby", "_retitle", "_import_time", "_watch_import_env", "_store_waits_for_rank0", "_preload", "_rss"):
        g.pop(name, None)
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
        code = compile(source, full, "exec", dont_inherit=True)  # absolute, as a fresh run's
        builtins = g["__builtins__"]
        g.clear()
        # In a fresh interpreter's order.
        g.update(__name__="__main__", __doc__=None, __package__=None,
                 __loader__=importlib.machinery.SourceFileLoader("__main__", full),
                 __spec__=None, __annotations__={}, __builtins__=builtins, __file__=full, __cached__=None)
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


def _rss():
    import os

    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _preload(names, seconds, growth):
    # The installed packages the job's first attempt imported: each one
    # not imported yet, in the order it was, until the time or memory
    # bound is reached; one that fails is skipped (it fails the same in
    # the program, or the program never imports it that way).
    import importlib
    import sys
    import time

    done = []
    t0, rss0 = time.monotonic(), _rss()
    for name in names:
        if not isinstance(name, str) or not name.isidentifier() or name.startswith("_"):
            continue
        if time.monotonic() - t0 > seconds or _rss() - rss0 > growth:
            break
        if name in sys.modules:
            continue
        try:
            importlib.import_module(name)
            done.append(name)
        except BaseException:  # ImportError, or a package that exits at import: never the standby's end
            sys.modules.pop(name, None)
    return done


def _retitle(argv):
    # /proc/self/cmdline (what ps shows) becomes argv: the kernel reads it
    # from [arg_start, arg_end) of our stack (/proc/self/stat fields 48,
    # 49), where the bootstrap's own argv lies; the fresh one is written
    # over it, the rest of the area zeroed (so the area still ends in a
    # NUL: cmdline is the fresh argv followed by NULs). Python keeps its own
    # copies of argv, so nothing reads that memory again. An argv longer
    # than the bootstrap's (which holds this whole file) is left alone.
    try:
        import ctypes
        import os

        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rpartition(b")")[2].split()
        start, end = int(fields[45]), int(fields[46])  # fields 48 and 49
        raw = b"\0".join(os.fsencode(a) for a in argv) + b"\0"
        if start <= 0 or len(raw) > end - start:
            return
        ctypes.memmove(start, raw + b"\0" * (end - start - len(raw)), end - start)
    except Exception:
        pass


def _store_waits_for_rank0():
    # Restarted ranks start within milliseconds of each other, so a rank
    # other than 0 often reaches init_process_group before rank 0's
    # TCPStore listens; torch's client then sleeps a whole second before it
    # tries again (restarts of 0.1 s or 1.1 s). Here such a rank first waits
    # for the port to accept, trying every 2 ms, then connects as torch
    # would. torch's env:// and tcp:// rendezvous both go through
    # torch.distributed.rendezvous._create_c10d_store.
    try:
        import functools
        import importlib
        import socket
        import time

        # Not `import … as`: torch.distributed's rendezvous is also the
        # name of a function there, which that would give.
        rdzv = importlib.import_module("torch.distributed.rendezvous")
    except Exception:
        return
    real = getattr(rdzv, "_create_c10d_store", None)
    if real is None:
        return

    @functools.wraps(real)
    def _create_c10d_store(hostname, port, rank, world_size, timeout, *args, **kwargs):
        if rank != 0:
            deadline = time.monotonic() + min(timeout.total_seconds(), 60.0)
            while time.monotonic() < deadline:
                try:
                    socket.create_connection((hostname, port), timeout=1.0).close()
                    break
                except OSError:
                    time.sleep(0.002)
        return real(hostname, port, rank, world_size, timeout, *args, **kwargs)

    rdzv._create_c10d_store = _create_c10d_store


def _import_time(name):
    if name.startswith("TORCHELASTIC_"):
        return False  # torchrun's, per rank and restart; torch reads them later
    return name.startswith(("CUDA_", "TORCH_", "PYTORCH_", "NCCL_", "OMP_", "MKL_", "KMP_"))


def _watch_import_env(import_env, job_env, preload, fresh_argv):
    # Until the program's first import of torch (or a --standby-preload
    # module): then compare the import-time variables it changed with
    # those torch was imported under.
    import builtins
    import os
    import sys

    import_time = _import_time  # __main__'s globals are the program's from now on
    roots = {"torch"} | {m.split(".")[0] for m in preload}
    real = builtins.__import__

    def settle():
        changed = sorted(k for k in set(os.environ) | set(import_env)
                         if import_time(k) and os.environ.get(k) != import_env.get(k) and os.environ.get(k) != job_env.get(k))
        cold = []
        for k in changed:
            v = os.environ.get(k)
            if k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS") and v is not None and v.isdigit() and int(v) > 0:
                sys.modules["torch"].set_num_threads(int(v))  # as torch would have read it at import
            else:
                cold.append(k)
        if not cold:
            return
        said = ", ".join("%s=%s" % (k, os.environ.get(k, "(unset)")) for k in cold)
        was = ", ".join("%s=%s" % (k, import_env.get(k, "(unset)")) for k in cold)
        sys.stdout.flush()
        sys.stderr.write("gotrain: rank %s: the program set %s before importing torch, which this warm standby imported with %s: "
                         "it runs again in a fresh interpreter (a cold start; the same pid)\n" % (job_env.get("RANK", "?"), said, was))
        sys.stderr.flush()
        os.execve(sys.executable, fresh_argv, job_env)

    def hook(name, globals=None, locals=None, fromlist=(), level=0):
        if level == 0 and name.partition(".")[0] in roots and builtins.__import__ is hook:
            builtins.__import__ = real
            settle()
        return real(name, globals, locals, fromlist, level)

    builtins.__import__ = hook


_gotrain_standby()
