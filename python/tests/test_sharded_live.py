"""Sharded fan-out against live replicas: run_tests.sh starts, on the embedded broker of the
unsharded replica of test_live, two more replicas with `--shard 0/2` and `--shard 1/2`, and
replays the trace. For a few hundred trace prompts the merged answer of the two shards equals
the unsharded one (scores, depths, totals, flags), with both clients and with a static as well
as a discovered map; ListWorkers merges too. Then shard 1/2's replica is stopped (SIGSTOP: a
hung replica) and killed (SIGKILL): answers are flagged partial, name the missing partitions,
never raise and never hold a worker of the missing shard.

PREFIXLOG_GRPC_SHARDS = "shard 0/2 endpoint,shard 1/2 endpoint", PREFIXLOG_SHARD_PIDS = their
process ids, PREFIXLOG_TEST_BROKERS = the broker (the test publishes WorkerAdded records).
"""
import json
import os
import signal
import socket
import time

import pytest

from prefixlog_client import IndexClient, partition_of
from prefixlog_client._proto import records_pb2
from prefixlog_client.partitioning import U64, fmix64

from test_live import ADDR as UNSHARDED, KS, TRACE, full_chain_answer, last_chain

SHARDS = [e for e in os.environ.get("PREFIXLOG_GRPC_SHARDS", "").split(",") if e]
PIDS = [int(p) for p in os.environ.get("PREFIXLOG_SHARD_PIDS", "").split(",") if p]
BROKERS = os.environ.get("PREFIXLOG_TEST_BROKERS")
pytestmark = pytest.mark.skipif(
    not (UNSHARDED and len(SHARDS) == 2 and len(PIDS) == 2),
    reason="PREFIXLOG_GRPC_SHARDS / PREFIXLOG_SHARD_PIDS not set (run python/run_tests.sh)",
)
PROMPTS = 300
EVEN, ODD = {0, 2}, {1, 3}  # shard 0/2 and shard 1/2 of the 4-partition log


def chains():
    """Local hashes (copy 0, stretch 1, as test_live.last_chain) of PROMPTS requests spread over
    the whole trace, the last one included (its chain is resident)."""
    with open(TRACE) as f:
        requests = [json.loads(line)["hash_ids"] for line in f if line.strip()]
    step = max(len(requests) // PROMPTS, 1)
    picked = requests[::-1][::step][:PROMPTS]
    return [[fmix64(fmix64(((i * 0x100) & U64) ^ 0) ^ 0) for i in ids] for ids in picked]


def view(r):
    return [(s.worker, s.dp_rank, s.lane, s.depth, s.total_blocks, s.inferred, s.gapped, s.intervals) for s in r.scores]


@pytest.fixture(scope="module")
def caught_up():
    """The unsharded replica has the whole replayed chain (so the log is applied)."""
    with IndexClient([UNSHARDED], deadline=5.0) as c:
        full_chain_answer(c, last_chain())


def sharded(client_factory, kind, deadline=5.0):
    if kind == "static":
        return client_factory(shards={"0/2": [SHARDS[0]], "1/2": [SHARDS[1]]}, deadline=deadline)
    return client_factory(SHARDS, discover=True, deadline=deadline)


@pytest.mark.parametrize("kind", ["static", "discovered"])
def test_merged_shards_answer_as_the_unsharded_replica(caught_up, client_factory, kind):
    whole = client_factory([UNSHARDED], deadline=5.0)
    c = sharded(client_factory, kind)
    scored = 0
    for chain in chains():
        want = whole.match(KS, hashes=chain)
        # Read at least the unsharded answer's state (the log is not written meanwhile).
        got = c.match(KS, hashes=chain, min_offsets=want.applied)
        assert (got.outcome, view(got)) == (want.outcome, view(want)), chain
        assert not got.partial and got.missing_partitions == [] and got.anomalies == 0
        assert got.partitions == [0, 1, 2, 3] and [p for p, _ in got.applied] == [0, 1, 2, 3]
        assert sorted(got.shards) == ["0/2", "1/2"]
        scored += want.outcome == "scores"
    assert scored > PROMPTS // 2, scored  # the comparison is about real answers
    # top_k after the merge, and intervals, on the resident chain.
    chain = last_chain()
    for kw in ({"top_k": 1}, {"top_k": 3}, {"intervals": True}):
        assert view(c.match(KS, hashes=chain, **kw)) == view(whole.match(KS, hashes=chain, **kw)), kw
    if kind == "discovered":
        assert [(s.key, s.endpoints, sorted(s.partitions)) for s in c.shards] == [
            ("0/2", [SHARDS[0]], sorted(EVEN)), ("1/2", [SHARDS[1]], sorted(ODD))]


def test_discovery_prefers_the_sharded_layout_when_both_are_ready(caught_up, client_factory):
    c = client_factory([UNSHARDED, *SHARDS], discover=True, deadline=5.0)
    r = c.match(KS, hashes=last_chain())
    assert [s.key for s in c.shards] == ["0/2", "1/2"] and sorted(r.shards) == ["0/2", "1/2"]


def test_list_workers_merges_the_shards(caught_up, client_factory):
    from confluent_kafka import Producer  # installed by run_tests.sh (the gateway example's requirement)

    workers = list(range(8))  # the replay's simulated workers
    producer = Producer({"bootstrap.servers": BROKERS, "enable.idempotence": True})
    for w in workers:
        rec = records_pb2.Record(version=1, lifecycle=records_pb2.WorkerLifecycle(
            worker=w, added=records_pb2.WorkerAdded(metadata={"endpoint": f"http://sim-{w}", "model": "trace"})))
        producer.produce("prefixlog.records", key=w.to_bytes(8, "big"), value=rec.SerializeToString(), partition=partition_of(w, 4))
    assert producer.flush(30) == 0
    whole, c = client_factory([UNSHARDED]), sharded(client_factory, "static")
    end = time.monotonic() + 30
    while True:
        want, got = whole.list_workers(deadline=5.0), c.list_workers(deadline=5.0)
        # Not counting the SGLang facade test's workers (test_sglang_facade.py, same log).
        replayed = [w for w in want.workers if "sgl.worker_id" not in w.metadata]
        if len(replayed) >= len(workers) and got.workers == want.workers:
            break
        assert time.monotonic() < end, (want, got)
        time.sleep(0.2)
    sims = [w for w in got.workers if "sgl.worker_id" not in w.metadata]
    assert [(w.worker, w.metadata["endpoint"]) for w in sims] == [(w, f"http://sim-{w}") for w in workers]
    assert all(partition_of(w.worker, 4) == w.partition for w in got.workers)
    assert got.partitions == [0, 1, 2, 3] and not got.partial


def check_partial(c, whole, reason_prefix, prompts):
    """Every answer is partial, names shard 1/2's partitions, and equals the unsharded answer
    restricted to shard 0/2's workers."""
    for chain in chains()[:prompts]:
        got = c.match(KS, hashes=chain)
        want = whole.match(KS, hashes=chain)
        assert got.outcome != "unavailable" and got.partial, got
        assert got.missing_shards == ["1/2"] and got.missing_partitions == sorted(ODD)
        assert got.reason.startswith("partial: 1/2: " + reason_prefix), got.reason
        assert all(partition_of(s.worker, 4) in EVEN for s in got.scores)
        assert view(got) == [v for v in view(want) if partition_of(v[0], 4) in EVEN]
        assert got.partitions == sorted(EVEN)


def test_a_hung_shard_gives_partial_answers(caught_up, client_factory):
    whole = client_factory([UNSHARDED], deadline=5.0)
    # Each query waits out the deadline for the hung shard: few prompts, and a deadline the
    # healthy shard meets even on a loaded machine.
    static, discovered = sharded(client_factory, "static", 1.0), sharded(client_factory, "discovered", 1.0)
    discovered.match(KS, hashes=[1])  # the asyncio client discovers on its first query
    assert [s.endpoints for s in discovered.shards] == [[SHARDS[0]], [SHARDS[1]]]
    os.kill(PIDS[1], signal.SIGSTOP)  # accepts connections, never answers
    try:
        for c in (static, discovered):
            check_partial(c, whole, "timeout", 8)
    finally:
        os.kill(PIDS[1], signal.SIGCONT)


def wait_refused(endpoint):
    """Waits until `endpoint` refuses connections: the kernel has closed a killed process's
    sockets (a bounded number of tries, then the test goes on and says what it sees)."""
    host, port = endpoint.rsplit(":", 1)
    for _ in range(200):
        try:
            socket.create_connection((host, int(port)), timeout=1.0).close()
        except OSError:
            return
        time.sleep(0.05)


def test_a_dead_shard_gives_partial_answers(caught_up, client_factory):
    whole = client_factory([UNSHARDED], deadline=5.0)
    try:
        os.kill(PIDS[1], signal.SIGKILL)
    except ProcessLookupError:  # killed (and reaped) for the other client already
        pass
    wait_refused(SHARDS[1])
    # A discovered map still names shard 1/2: shard 0/2's Describe says there are two.
    for c in (sharded(client_factory, "static", 2.0), sharded(client_factory, "discovered", 2.0)):
        check_partial(c, whole, "disconnected", 60)  # refused at once: no waiting
