"""Outside gotrain (plain python, torchrun: no GOTRAIN_AGENT) everything
imports and does nothing, and says so once."""

from conftest import run_python

PROGRAM = """
import torch, gotrain, gotrain_snapshot
m = torch.nn.Linear(2, 2)
print(gotrain.available(), gotrain.snapshot({"m": m}, 1), gotrain.snapshot(m, 2),
      gotrain.restore(), gotrain.restore_into({"m": m}), gotrain.source(), gotrain.wait(),
      gotrain_snapshot.restore() is None)
"""


def test_outside_gotrain_does_nothing_and_notes_once():
    p = run_python(PROGRAM, env_drop=("GOTRAIN_AGENT",))
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["False", "False", "False", "None", "None", "None", "True", "True"]
    notes = [line for line in p.stderr.splitlines() if "not running under gotrain" in line]
    assert len(notes) == 1, p.stderr
    assert "gotrain torchrun" in notes[0] and "gotrain launch" in notes[0]


def test_unreachable_agent_names_rank_and_host():
    p = run_python("import gotrain; gotrain.snapshot({}, 1)", GOTRAIN_AGENT="/nonexistent/agent.sock", GOTRAIN_RANK="3")
    assert p.returncode != 0
    last = p.stderr.strip().splitlines()[-1]
    assert "rank 3 on " in last and "cannot reach this node's gotrain agent" in last and "still running" in last


def test_version_is_a_release():
    p = run_python("import gotrain; print(gotrain.__version__)")
    parts = p.stdout.strip().split(".")
    assert p.returncode == 0 and len(parts) == 3 and all(x.isdigit() for x in parts), p.stdout
