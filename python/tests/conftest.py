"""Fixtures for the gotrain package's tests.

The package under test is the tree's (python/), first on sys.path. The
agent fixture runs the real snapshot server (the Go memsnap.Server, through
internal/testing/snapserve) on a socket in a temporary directory: the
package talks to it exactly as a worker talks to its node's agent.
"""

import os
import shutil
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.dirname(HERE)
REPO = os.path.dirname(PYTHON_DIR)
sys.path.insert(0, PYTHON_DIR)

TOKEN = "pytest-token"


@pytest.fixture(scope="session")
def snapserve(tmp_path_factory):
    """The snapserve binary: GOTRAIN_TEST_SNAPSERVE (make pytest builds
    it), else built here with go."""
    exe = os.environ.get("GOTRAIN_TEST_SNAPSERVE")
    if exe:
        return exe
    go = shutil.which("go") or "/usr/local/go/bin/go"
    if not os.access(go, os.X_OK):
        pytest.fail("no go to build internal/testing/snapserve: set GOTRAIN_TEST_SNAPSERVE or run `make pytest`")
    exe = str(tmp_path_factory.mktemp("bin") / "snapserve")
    subprocess.run([go, "build", "-o", exe, "./internal/testing/snapserve"], cwd=REPO, check=True)
    return exe


def _reset(memsnap):
    """Forget the connection and buffers: each test starts as a fresh process would."""
    if memsnap._pending is not None:
        memsnap._pending.wait(30)
    if memsnap._conn is not None:
        memsnap._conn.close()
    for b in memsnap._buffers:
        if b is not None:
            b.close()
    memsnap._conn, memsnap._source, memsnap._pending, memsnap._noted = None, None, None, False
    memsnap._buffers.clear()
    memsnap._next_buffer = 0


class Agent:
    def __init__(self, proc, sock):
        self.proc, self.sock = proc, sock


@pytest.fixture
def agent(snapserve, tmp_path, monkeypatch):
    """A running snapshot server, and this process set up as rank 0 of its
    node (GOTRAIN_AGENT, the token, the rank)."""
    sock = str(tmp_path / "snapshot.sock")
    proc = subprocess.Popen([snapserve, "-socket", sock, "-token", TOKEN], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline().strip()
        if line != "ready":
            pytest.fail("snapserve did not start (printed %r, exit %r)" % (line, proc.poll()))
        monkeypatch.setenv("GOTRAIN_AGENT", str(tmp_path / "agent.sock"))
        monkeypatch.setenv("GOTRAIN_JOB_TOKEN", TOKEN)
        monkeypatch.setenv("GOTRAIN_RANK", "0")
        monkeypatch.delenv("GOTRAIN_RUN_ID", raising=False)
        from gotrain import memsnap
        _reset(memsnap)
        yield Agent(proc, sock)
        _reset(memsnap)
    finally:
        proc.stdin.close()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        proc.stdout.close()


def run_python(code, env_drop=(), **env):
    """Run code in a fresh interpreter with the tree's package on its path;
    returns the CompletedProcess (stdout and stderr as text)."""
    e = {k: v for k, v in os.environ.items() if k not in env_drop}
    e["PYTHONPATH"] = PYTHON_DIR
    e["PYTHONDONTWRITEBYTECODE"] = "1"
    e.update(env)
    return subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True, timeout=300)
