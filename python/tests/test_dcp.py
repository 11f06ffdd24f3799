"""gotrain.dcp: its torch.distributed.checkpoint storage. DCP is torch 2.x;
Debian 12's torch 1.13 has none, so there these tests skip and the Go
test TestDCPWriterAndReader (python/) runs them where a torch 2 is."""

import pytest

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint", reason="torch.distributed.checkpoint needs torch 2.x")

import gotrain  # noqa: E402


def test_dcp_round_trip(agent):
    model = torch.nn.Linear(4, 2)
    dcp.save({"model": model.state_dict(), "meta": {"epoch": 3}}, storage_writer=gotrain.dcp.writer(9))
    fresh = torch.nn.Linear(4, 2)
    sd = {"model": fresh.state_dict(), "meta": {"epoch": 0}}
    r = gotrain.dcp.reader()
    assert r.found and r.step == 9
    dcp.load(sd, storage_reader=r)
    fresh.load_state_dict(sd["model"])
    assert torch.equal(fresh.weight, model.weight) and sd["meta"]["epoch"] == 3 and r.source == "agent"


def test_reader_without_a_snapshot(agent):
    r = gotrain.dcp.reader()
    assert not r.found
    with pytest.raises(RuntimeError, match="holds no snapshot"):
        r.read_metadata()
