"""The Python canonical hash reproduces the Rust one (engine/src/scheme.rs) on the shared
golden vectors."""
import json
import os

from prefixlog_client import block_hashes

GOLDEN = os.path.join(os.path.dirname(__file__), "..", "golden_vectors.json")


def test_golden_vectors():
    g = json.load(open(GOLDEN))
    assert g["scheme"] == 1
    assert len(g["cases"]) >= 5
    for c in g["cases"]:
        got = ["%016x" % h for h in block_hashes(c["tokens"], c["block_size"], c.get("namespace", ""))]
        assert got == c["hashes"], c["name"]


def test_partial_tail_and_chaining():
    assert block_hashes([1, 2, 9, 9, 5], 2) == block_hashes([1, 2, 9, 9], 2)
    assert block_hashes([1, 2, 9, 9], 2)[1] != block_hashes([3, 4, 9, 9], 2)[1]
    assert block_hashes([1, 2], 0) == []
