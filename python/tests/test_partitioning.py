"""partition_of reproduces the Rust one (engine/src/types.rs) on golden_vectors.json's
"partition_of" vectors, which the Rust tests read too."""
import json
import os

import pytest

from prefixlog_client import partition_of
from prefixlog_client.partitioning import fmix64

GOLDEN = os.path.join(os.path.dirname(__file__), "..", "golden_vectors.json")


def vectors():
    with open(GOLDEN) as f:
        return json.load(f)["partition_of"]


def test_golden_vectors():
    for v in vectors():
        assert partition_of(v["worker"], v["partitions"]) == v["partition"], v


def test_vectors_cover_the_edges():
    vs = vectors()
    workers = {v["worker"] for v in vs}
    assert {0, 1, 2, 255, 2**32, 2**63, 2**64 - 1} < workers  # plus pseudo-random ones
    assert {v["partitions"] for v in vs} == {1, 2, 3, 16, 64, 1000}
    # Every worker under every partition count, and not all in one partition (a degenerate
    # function would pass single-partition vectors).
    assert len(vs) == len(workers) * 6
    assert len({v["partition"] for v in vs if v["partitions"] == 1000}) > 5


def test_fmix64_reference_values():
    # 0 is a fixed point; 1 -> 0xb456bcfc34c2cb2c, as engine/src/digest.rs mix64 computes it.
    assert fmix64(0) == 0
    assert fmix64(1) == 0xB456BCFC34C2CB2C


def test_zero_partitions_count_as_one():
    assert partition_of(12345, 0) == partition_of(12345, 1) == 0


@pytest.mark.parametrize("args", [(-1, 4), (2**64, 4), (1, -1), (1, 2**32)])
def test_out_of_range_arguments_are_refused(args):
    with pytest.raises(ValueError):
        partition_of(*args)
