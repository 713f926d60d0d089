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
        hs = block_hashes(c["tokens"], c["block_size"], c.get("namespace", ""),
                          cache_salt=c.get("cache_salt", ""), extra=c.get("extra"),
                          mm_inputs=c.get("mm_inputs"), lookahead=c.get("lookahead", 0))
        got = ["%016x" % h for h in hs]
        assert got == c["hashes"], c["name"]
    names = {c["name"] for c in g["cases"]}
    assert {"cache_salt", "mm_second_block", "lora_salt_mm", "mm_input_at_offset_2", "lookahead_1",
            "lookahead_2_salt_mm_in_window"} <= names, "the keyed cases are pinned"


def test_partial_tail_and_chaining():
    assert block_hashes([1, 2, 9, 9, 5], 2) == block_hashes([1, 2, 9, 9], 2)
    assert block_hashes([1, 2, 9, 9], 2)[1] != block_hashes([3, 4, 9, 9], 2)[1]
    assert block_hashes([1, 2], 0) == []


def test_keys_are_a_set_and_plain_blocks_are_unchanged():
    t = list(range(1, 9))
    assert block_hashes(t, 4, extra=[(0, ["b", "a", "b"])]) == block_hashes(t, 4, extra=[(0, ["a", "b"])])
    assert block_hashes(t, 4, extra=[(1, ["img"])])[0] == block_hashes(t, 4)[0]
    assert block_hashes(t, 4, cache_salt="s")[0] != block_hashes(t, 4)[0]
