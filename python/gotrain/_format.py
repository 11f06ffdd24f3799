"""The snapshot format: raw tensor bytes behind a data-only header.

A snapshot is one file (a memfd):

    offset 0    b"GTSNAP1\\n"                       magic, 8 bytes
    offset 8    header length H                      little-endian u64
    offset 16   header, H bytes of UTF-8 JSON
    then        each tensor's bytes, at offsets aligned to ALIGN

The header holds the facts (rank, step, generation, run id), the tensors'
dtypes, shapes, offsets and lengths, and the state's structure with its
plain values. Nothing in it is code: restoring reads numbers, strings and
bytes, and every offset and length is checked against the file before a
byte is used. A snapshot is served by another process (this node's agent,
or a peer node's), so it is never unpickled.

This module is pure (no torch): encode() takes a predicate that says
what a tensor is and a function that gives its dtype name and shape, and
decode() hands back tensor references for the caller to fill.
"""

import base64
import json
import math
import struct

MAGIC = b"GTSNAP1\n"
PREFIX = struct.Struct("<8sQ")
ALIGN = 256
# Bounds a header from another process must respect before it is parsed.
MAX_HEADER = 64 << 20
MAX_DEPTH = 64

# dtype name → bytes per element. The names are torch's (str(dtype) without
# "torch."); a dtype outside this table is refused both ways.
DTYPE_SIZES = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2,
    "complex128": 16, "complex64": 8,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1,
    "uint16": 2, "uint32": 4, "uint64": 8,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1,
}


class FormatError(ValueError):
    """A snapshot that is not one this format writes: it is never used."""


class TensorRef:
    """A tensor's place in a decoded snapshot: index into Layout.tensors."""

    __slots__ = ("index",)

    def __init__(self, index):
        self.index = index

    def __repr__(self):
        return "TensorRef(%d)" % self.index


class TensorEntry:
    __slots__ = ("dtype", "shape", "offset", "nbytes")

    def __init__(self, dtype, shape, offset, nbytes):
        self.dtype, self.shape, self.offset, self.nbytes = dtype, tuple(shape), offset, nbytes

    def numel(self):
        n = 1
        for d in self.shape:
            n *= d
        return n


class Layout:
    """A snapshot's header: facts, tensors and the encoded tree."""

    def __init__(self, facts, tensors, tree, data_start, size):
        self.facts, self.tensors, self.tree = facts, tensors, tree
        self.data_start, self.size = data_start, size

    def header_bytes(self):
        doc = dict(self.facts)
        doc["size"] = self.size
        doc["tensors"] = [{"dtype": t.dtype, "shape": list(t.shape), "offset": t.offset, "nbytes": t.nbytes} for t in self.tensors]
        doc["tree"] = self.tree
        return json.dumps(doc, separators=(",", ":"), allow_nan=False).encode()

    def prefix(self, header):
        return PREFIX.pack(MAGIC, len(header)) + header


def _align(n, a=ALIGN):
    return (n + a - 1) // a * a


def encode(state, is_tensor, describe, facts):
    """Return (layout, tensors): layout places every tensor of state; tensors
    are state's tensors in layout order. describe(t) gives (dtype name, shape,
    nbytes). facts: rank, step, generation, run_id."""
    tensors = []
    entries = []

    def enc(v, path, depth):
        if depth > MAX_DEPTH:
            raise TypeError("gotrain snapshot: the state nests deeper than %d levels at %s" % (MAX_DEPTH, path or "the top"))
        if is_tensor(v):
            dtype, shape, nbytes = describe(v)
            if dtype not in DTYPE_SIZES:
                raise TypeError("gotrain snapshot: the tensor at %s has dtype %s, which snapshots do not keep" % (path or "the top", dtype))
            tensors.append(v)
            entries.append(TensorEntry(dtype, shape, 0, nbytes))
            return {"t": len(tensors) - 1}
        if v is None or isinstance(v, (bool, str)):
            return v
        if isinstance(v, int):
            return int(v)
        if isinstance(v, float):
            if math.isfinite(v):
                return float(v)
            return {"f": "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")}
        if isinstance(v, (bytes, bytearray)):
            return {"b": base64.b64encode(bytes(v)).decode()}
        if isinstance(v, tuple):
            return {"tuple": [enc(x, "%s[%d]" % (path, i), depth + 1) for i, x in enumerate(v)]}
        if isinstance(v, list):
            return [enc(x, "%s[%d]" % (path, i), depth + 1) for i, x in enumerate(v)]
        if isinstance(v, dict):
            if all(isinstance(k, str) for k in v):
                return {"d": {k: enc(x, "%s.%s" % (path, k) if path else k, depth + 1) for k, x in v.items()}}
            items = []
            for k, x in v.items():
                if not (k is None or isinstance(k, (bool, int, float, str, tuple))):
                    raise TypeError("gotrain snapshot: a key of type %s at %s: keys must be plain values" % (type(k).__name__, path or "the top"))
                items.append([enc(k, path, depth + 1), enc(x, "%s[%r]" % (path, k), depth + 1)])
            return {"dk": items}
        raise TypeError("gotrain snapshot: the value at %s is a %s; snapshots keep tensors, numbers, strings, bytes, "
                        "None and lists, tuples and dicts of them (convert it, or keep it out of the snapshot)"
                        % (path or "the top", type(v).__module__ + "." + type(v).__qualname__))

    tree = enc(state, "", 0)
    layout = Layout(dict(facts), entries, tree, 0, 0)
    # The header's length depends on the offsets it names: lay the data out
    # after a bound on the header, then pad the header up to it.
    probe = len(layout.header_bytes()) + 32 * len(entries) + 64
    start = _align(PREFIX.size + probe)
    off = start
    for e in entries:
        e.offset = off
        off = _align(off + e.nbytes)
    layout.data_start, layout.size = start, off
    return layout, tensors


def decode(buf, want_rank=None):
    """Parse and check the header of buf (a snapshot's bytes, any buffer).
    Returns a Layout whose tree holds TensorRefs; FormatError if anything
    does not hold."""
    size = len(buf)
    if size < PREFIX.size:
        raise FormatError("%d bytes: shorter than the format's prefix" % size)
    magic, hlen = PREFIX.unpack_from(buf, 0)
    if magic != MAGIC:
        raise FormatError("not a gotrain snapshot (magic %r)" % bytes(magic))
    if hlen > MAX_HEADER or PREFIX.size + hlen > size:
        raise FormatError("a header of %d bytes in a file of %d" % (hlen, size))
    try:
        doc = json.loads(bytes(buf[PREFIX.size:PREFIX.size + hlen]).decode())
    except (UnicodeDecodeError, ValueError) as e:
        raise FormatError("the header is not JSON: %s" % e) from None
    if not isinstance(doc, dict):
        raise FormatError("the header is not an object")
    facts = {}
    for key, kind in (("rank", int), ("step", int), ("generation", int), ("run_id", str)):
        v = doc.get(key)
        if not isinstance(v, kind) or isinstance(v, bool):
            raise FormatError("the header's %s is %r" % (key, v))
        facts[key] = v
    if doc.get("size") != size:
        raise FormatError("the header says %r bytes, the file holds %d" % (doc.get("size"), size))
    if want_rank is not None and facts["rank"] != want_rank:
        raise FormatError("a snapshot of rank %d, not of rank %d" % (facts["rank"], want_rank))
    data_start = _align(PREFIX.size + hlen)
    raw = doc.get("tensors")
    if not isinstance(raw, list):
        raise FormatError("the header's tensors are not a list")
    entries = []
    for i, t in enumerate(raw):
        if not isinstance(t, dict):
            raise FormatError("tensor %d is not an object" % i)
        dtype, shape, off, n = t.get("dtype"), t.get("shape"), t.get("offset"), t.get("nbytes")
        if dtype not in DTYPE_SIZES:
            raise FormatError("tensor %d has dtype %r" % (i, dtype))
        if not isinstance(shape, list) or len(shape) > 64 or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
            raise FormatError("tensor %d has shape %r" % (i, shape))
        if not all(isinstance(x, int) and not isinstance(x, bool) for x in (off, n)):
            raise FormatError("tensor %d has offset %r and length %r" % (i, off, n))
        e = TensorEntry(dtype, shape, off, n)
        if n != e.numel() * DTYPE_SIZES[dtype]:
            raise FormatError("tensor %d: %d bytes for shape %r of %s" % (i, n, shape, dtype))
        if off < data_start or off % ALIGN or off + n > size:
            raise FormatError("tensor %d: bytes [%d, %d) outside the data [%d, %d)" % (i, off, off + n, data_start, size))
        entries.append(e)
    count = len(entries)

    def dec(v, depth):
        if depth > MAX_DEPTH:
            raise FormatError("the state nests deeper than %d levels" % MAX_DEPTH)
        if v is None or isinstance(v, (bool, int, float, str)):
            return v
        if isinstance(v, list):
            return [dec(x, depth + 1) for x in v]
        if isinstance(v, dict) and len(v) == 1:
            (tag, x), = v.items()
            if tag == "t" and isinstance(x, int) and not isinstance(x, bool) and 0 <= x < count:
                return TensorRef(x)
            if tag == "f" and x in ("nan", "inf", "-inf"):
                return float(x)
            if tag == "b" and isinstance(x, str):
                try:
                    return base64.b64decode(x, validate=True)
                except ValueError:
                    raise FormatError("bad bytes in the header") from None
            if tag == "tuple" and isinstance(x, list):
                return tuple(dec(y, depth + 1) for y in x)
            if tag == "d" and isinstance(x, dict):
                return {k: dec(y, depth + 1) for k, y in x.items()}
            if tag == "dk" and isinstance(x, list):
                out = {}
                for pair in x:
                    if not isinstance(pair, list) or len(pair) != 2:
                        raise FormatError("a bad dict item in the header")
                    k = dec(pair[0], depth + 1)
                    if isinstance(k, (list, dict, TensorRef)):
                        raise FormatError("a dict key that is not a plain value")
                    out[k] = dec(pair[1], depth + 1)
                return out
        raise FormatError("a value the format does not write: %.80r" % (v,))

    tree = dec(doc.get("tree"), 0)
    return Layout(facts, entries, tree, data_start, size)
