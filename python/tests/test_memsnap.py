"""The snapshot tier against the real snapshot server (see conftest.agent):
snapshot, restore_into into existing tensors, restore as new ones."""

import os
import socket

import pytest

torch = pytest.importorskip("torch")

import gotrain  # noqa: E402
from gotrain import memsnap  # noqa: E402
from conftest import TOKEN, run_python  # noqa: E402


def build():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2))
    return m, torch.optim.Adam(m.parameters(), lr=0.01)


def trained():
    m, opt = build()
    for _ in range(2):
        m(torch.randn(5, 8)).sum().backward()
        opt.step()
    return m, opt


def test_restore_into_copies_into_existing_tensors(agent):
    model, opt = trained()
    extra = {"epoch": 3, "half": torch.arange(6, dtype=torch.float16).reshape(2, 3)[:, 1:], "name": "run"}
    p = gotrain.snapshot({"model": model, "opt": opt, "extra": extra}, 7)
    assert p and p.wait() and p.step == 7
    assert gotrain.available()

    fresh, fopt = build()
    before = {k: (id(t), t.data_ptr()) for k, t in fresh.state_dict(keep_vars=True).items()}
    state, step, src = gotrain.restore_into({"model": fresh, "opt": fopt, "extra": None}, with_source=True)
    assert (step, src) == (7, "agent")
    after = {k: (id(t), t.data_ptr()) for k, t in fresh.state_dict(keep_vars=True).items()}
    assert before == after, "restore_into must copy into the module's own tensors, not replace them"
    for k, v in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[k], v), k
    o1, o2 = opt.state_dict()["state"], fopt.state_dict()["state"]
    assert sorted(o1) == sorted(o2) and all(torch.equal(o1[i][n], o2[i][n]) for i in o1 for n in o1[i])
    e = state["extra"]
    assert e["epoch"] == 3 and e["name"] == "run" and torch.equal(e["half"], extra["half"]) and e["half"].dtype == torch.float16


def test_restore_returns_new_tensors(agent):
    w = torch.randn(3, 3)
    gotrain.snapshot({"w": w}, 4)
    state, step = gotrain.restore()
    assert step == 4 and torch.equal(state["w"], w) and state["w"].data_ptr() != w.data_ptr()
    state["w"].add_(1)  # the restored tensor is the program's own: writable
    assert gotrain.source() == "agent"


def test_newest_snapshot_wins(agent):
    for step in (1, 2, 3):
        gotrain.snapshot({"w": torch.full((4,), float(step))}, step)
    state, step = gotrain.restore()
    assert step == 3 and torch.equal(state["w"], torch.full((4,), 3.0))


def test_nothing_to_restore(agent):
    target = {"w": torch.zeros(2)}
    assert gotrain.restore() is None and gotrain.restore_into(target) is None
    assert torch.equal(target["w"], torch.zeros(2)) and gotrain.source() is None


def test_shape_mismatch_names_the_tensor_and_copies_nothing(agent):
    gotrain.snapshot({"a": torch.ones(2), "b": torch.ones(3)}, 5)
    target = {"a": torch.zeros(2), "b": torch.zeros(4)}
    with pytest.raises(RuntimeError) as e:
        gotrain.restore_into(target)
    msg = str(e.value)
    assert "rank 0 on " in msg and "step 5" in msg and "b of shape [3]" in msg and "model changed" in msg
    assert torch.equal(target["a"], torch.zeros(2)), "a mismatch must be found before anything is copied"


def test_state_the_format_cannot_keep_names_its_place(agent):
    with pytest.raises(TypeError, match="the value at extra.k is a builtins.set"):
        gotrain.snapshot({"extra": {"k": {1}}}, 1)


def test_wrong_token_refused(snapserve, agent, monkeypatch):
    monkeypatch.setenv("GOTRAIN_JOB_TOKEN", "not-" + TOKEN)
    with pytest.raises(RuntimeError, match="rank 0 on .*refused the snapshot connection"):
        gotrain.snapshot({"w": torch.ones(1)}, 1)
    assert not gotrain.available()


def test_state_outlives_the_process(agent):
    """A rank that exits and starts again (a new interpreter) restores the
    state the first one handed over."""
    save = "import torch, gotrain; assert gotrain.snapshot({'w': torch.arange(5.0)}, 11).wait(); print('saved')"
    load = "import torch, gotrain; s, step = gotrain.restore(); print(step, s['w'].tolist())"
    env = {k: os.environ[k] for k in ("GOTRAIN_AGENT", "GOTRAIN_JOB_TOKEN", "GOTRAIN_RANK")}
    p = run_python(save, **env)
    assert p.stdout.strip() == "saved", p.stderr
    p = run_python(load, **env)
    assert p.stdout.strip() == "11 [0.0, 1.0, 2.0, 3.0, 4.0]", p.stderr
    assert "restored the state of step 11 from this node's agent's memory" in p.stderr


def test_snapshot_socket_is_a_seqpacket_socket(agent):
    """The package finds the server beside GOTRAIN_AGENT, as the agent lays them out."""
    assert memsnap._socket_path() == agent.sock
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        s.connect(agent.sock)
    finally:
        s.close()
