"""The data-only snapshot format (gotrain._format): what it writes reads
back as it was, and anything else (tampered, oversized, garbage, a
pickle) is refused before a byte of it is used."""

import json
import math
import pickle
import struct

import pytest

from gotrain import _format
from gotrain._format import FormatError, TensorRef


class Raw:
    """A tensor as the pure format sees one: a dtype name, a shape and its bytes."""

    def __init__(self, dtype, shape, data):
        self.dtype, self.shape, self.data = dtype, tuple(shape), bytes(data)


FACTS = {"rank": 0, "step": 7, "generation": 2, "run_id": "run-a"}


def write(state, facts=FACTS):
    """The file snapshot() would write for state: prefix, padded header,
    each tensor's bytes at its offset."""
    layout, tensors = _format.encode(state, lambda v: isinstance(v, Raw), lambda t: (t.dtype, t.shape, len(t.data)), facts)
    header = layout.header_bytes()
    header += b" " * (layout.data_start - _format.PREFIX.size - len(header))
    buf = bytearray(layout.size)
    buf[:layout.data_start] = layout.prefix(header)
    for t, e in zip(tensors, layout.tensors):
        buf[e.offset:e.offset + e.nbytes] = t.data
    return buf


def header_of(buf):
    _, n = _format.PREFIX.unpack_from(buf, 0)
    return json.loads(bytes(buf[16:16 + n]))


def with_header(buf, doc):
    """buf with its header replaced by doc, padded to the same length."""
    _, n = _format.PREFIX.unpack_from(buf, 0)
    h = json.dumps(doc).encode()
    assert len(h) <= n, "the new header must fit the old one's room"
    out = bytearray(buf)
    out[16:16 + n] = h + b" " * (n - len(h))
    return out


def test_round_trip():
    w = Raw("float32", (2, 3), struct.pack("<6f", *range(6)))
    empty = Raw("int64", (0,), b"")
    state = {"model": {"w": w, "empty": empty}, "epoch": 3, "lr": 0.5, "nan": float("nan"), "inf": float("-inf"),
             "name": "run", "blob": b"\x00\x01", "pair": (1, [2.5, None]), "ints": {1: "a", (2, 3): "b"}, "ok": True}
    buf = write(state)
    layout = _format.decode(buf, want_rank=0)
    assert layout.facts == FACTS
    tree = layout.tree
    assert isinstance(tree["model"]["w"], TensorRef) and isinstance(tree["model"]["empty"], TensorRef)
    e = layout.tensors[tree["model"]["w"].index]
    assert (e.dtype, e.shape, e.nbytes) == ("float32", (2, 3), 24)
    assert e.offset % _format.ALIGN == 0 and e.offset >= layout.data_start
    assert bytes(buf[e.offset:e.offset + e.nbytes]) == w.data
    assert math.isnan(tree["nan"]) and tree["inf"] == float("-inf")
    rest = {k: tree[k] for k in ("epoch", "lr", "name", "blob", "pair", "ints", "ok")}
    assert rest == {"epoch": 3, "lr": 0.5, "name": "run", "blob": b"\x00\x01", "pair": (1, [2.5, None]),
                    "ints": {1: "a", (2, 3): "b"}, "ok": True}
    assert isinstance(tree["pair"], tuple) and isinstance(tree["ints"], dict)


def test_header_is_json_data():
    """The header is JSON: no code, no pickle opcodes."""
    doc = header_of(write({"w": Raw("uint8", (4,), b"abcd"), "x": 1}))
    assert doc["tree"] == {"d": {"w": {"t": 0}, "x": 1}}
    assert doc["tensors"] == [{"dtype": "uint8", "shape": [4], "offset": doc["tensors"][0]["offset"], "nbytes": 4}]


@pytest.mark.parametrize("value, what", [
    (object(), "builtins.object"),
    ({"k": {1, 2}}, "builtins.set"),
    ({object(): 1}, "keys must be plain values"),
    (Raw("qint8", (1,), b"\x00"), "dtype qint8"),
])
def test_encode_refuses_what_it_cannot_keep(value, what):
    with pytest.raises(TypeError) as e:
        write(value)
    assert what in str(e.value)


def test_encode_refuses_deep_nesting():
    v = 1
    for _ in range(_format.MAX_DEPTH + 2):
        v = [v]
    with pytest.raises(TypeError, match="nests deeper"):
        write(v)


def test_a_pickle_is_refused():
    """A pickle planted where a snapshot should be is not a snapshot: it is
    refused at the magic, never loaded."""
    class Boom:
        def __reduce__(self):
            return (exec, ("raise SystemExit('unpickled')",))
    with pytest.raises(FormatError, match="not a gotrain snapshot"):
        _format.decode(pickle.dumps(Boom()) + b"\x00" * 64)


@pytest.mark.parametrize("buf, why", [
    (b"", "shorter than the format's prefix"),
    (b"GTSNAP1\n", "shorter than the format's prefix"),
    (b"\x00" * 64, "not a gotrain snapshot"),
    (_format.PREFIX.pack(_format.MAGIC, _format.MAX_HEADER + 1) + b"{}", "a header of"),
    (_format.PREFIX.pack(_format.MAGIC, 1 << 40) + b"{}", "a header of"),
    (_format.PREFIX.pack(_format.MAGIC, 4) + b"\xff\xfe{}", "not JSON"),
    (_format.PREFIX.pack(_format.MAGIC, 2) + b"[]", "not an object"),
])
def test_garbage_and_oversized_refused(buf, why):
    with pytest.raises(FormatError, match=why):
        _format.decode(buf)


def tampered():
    """(name, edit of the header doc, what the refusal says)."""
    def set_tensor(key, value):
        def edit(doc):
            doc["tensors"][0][key] = value
        return edit

    def set_fact(key, value):
        def edit(doc):
            doc[key] = value
        return edit

    return [
        ("offset past the end", set_tensor("offset", 1 << 30), "outside the data"),
        ("offset into the header", set_tensor("offset", 0), "outside the data"),
        ("offset misaligned", set_tensor("offset", 2 * _format.ALIGN + 1), "outside the data"),
        ("length not the shape's", set_tensor("nbytes", 8), "bytes for shape"),
        ("negative dimension", set_tensor("shape", [-4]), "has shape"),
        ("unknown dtype", set_tensor("dtype", "object"), "has dtype"),
        ("offset a string", set_tensor("offset", "0"), "offset"),
        ("size a lie", set_fact("size", 1 << 20), "the file holds"),
        ("rank a string", set_fact("rank", "0"), "rank"),
        ("step a bool", set_fact("step", True), "step"),
        ("tensor index out of range", set_fact("tree", {"d": {"w": {"t": 5}}}), "does not write"),
        ("unknown tag", set_fact("tree", {"pickle": "gASV"}), "does not write"),
        ("bad bytes", set_fact("tree", {"b": "not base64!"}), "bad bytes"),
        ("dict key a list", set_fact("tree", {"dk": [[[1], 2]]}), "not a plain value"),
    ]


@pytest.mark.parametrize("name, edit, why", tampered(), ids=[t[0] for t in tampered()])
def test_tampered_header_refused(name, edit, why):
    buf = write({"w": Raw("float32", (4,), b"\x00" * 16)})
    doc = header_of(buf)
    edit(doc)
    with pytest.raises(FormatError, match=why):
        _format.decode(with_header(buf, doc))


def test_truncated_file_refused():
    buf = write({"w": Raw("float32", (64,), b"\x01" * 256)})
    with pytest.raises(FormatError, match="the file holds"):
        _format.decode(buf[:-1])


def test_another_ranks_snapshot_refused():
    buf = write({"w": Raw("uint8", (1,), b"x")}, facts=dict(FACTS, rank=3))
    with pytest.raises(FormatError, match="of rank 3, not of rank 0"):
        _format.decode(buf, want_rank=0)
    assert _format.decode(buf, want_rank=3).facts["rank"] == 3


def test_deep_header_refused():
    tree = 1
    for _ in range(_format.MAX_DEPTH + 2):
        tree = [tree]
    buf = write({"w": Raw("uint8", (1,), b"x"), "pad": "x" * 400})
    doc = header_of(buf)
    doc["tree"] = tree
    with pytest.raises(FormatError, match="nests deeper"):
        _format.decode(with_header(buf, doc))
