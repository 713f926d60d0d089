"""The side-by-side benchmark against the real Dynamo indexer (`bench_dynamo.py`), small and
agreement only: 16 vLLM engines publish the first 1,500 requests of the Mooncake conversation
trace through vLLM's own publisher to `python -m dynamo.indexer` and to prefixlog's Dynamo HTTP
facade, then 200 `/query` bodies go to both. Every answer must be equal; nothing is timed
(docs/benchmarks.md, "Against the real dynamo.indexer", has the full run)."""

from __future__ import annotations

import bench_dynamo


def test_trace_answers_equal_dynamo_indexer():
    res = bench_dynamo.run(engines=16, queries=200, clients=4, bs=16, limit=1500)
    assert res["queries"] == 200
    assert res["differ"] == 0, f"{res['differ']} of 200 answers differ (printed above)"
    # The trace was absorbed by both, and the queries found what it stored.
    real = res["dynamo"]["answers"]
    assert all(a[0] == 200 for a in real), real[:3]
    assert sum(1 for a in real if a[1].get("scores")) > 100
