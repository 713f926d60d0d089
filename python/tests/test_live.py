"""Against a live replica (run_tests.sh starts `prefixlog serve` and replays the trace), with
the sync and the asyncio client alike (the client_factory fixture).

PREFIXLOG_GRPC = the replica's gRPC address, PREFIXLOG_TRACE = the replayed trace (its last
request's chain is resident on the worker that served it: nothing evicts after it).
"""
import json
import os
import time

import grpc
import pytest

from prefixlog_client import match
from prefixlog_client._proto import query_pb2, query_pb2_grpc
from prefixlog_client.partitioning import U64, fmix64

ADDR = os.environ.get("PREFIXLOG_GRPC")
TRACE = os.environ.get("PREFIXLOG_TRACE")
KS = ("trace", 64, 1)  # the replay's keyspace (prefixlog/src/fleet_records.rs)
pytestmark = pytest.mark.skipif(not ADDR, reason="PREFIXLOG_GRPC not set (run python/run_tests.sh)")


def last_chain():
    """The workload's local hashes of the trace's last request (copy 0, stretch 1), as in
    workload/src/trace.rs expand_request (its mix64 is murmur3's fmix64)."""
    with open(TRACE) as f:
        for line in f:
            if line.strip():
                last = json.loads(line)
    return [fmix64(fmix64(((i * 0x100) & U64) ^ 0) ^ 0) for i in last["hash_ids"]]


def full_chain_answer(c, chain):
    """Polls (up to 30 s) until some worker matches the whole chain; returns that answer."""
    t = time.monotonic()
    while True:
        r = c.match(KS, hashes=chain)
        if r.outcome == "scores" and r.scores[0].depth == len(chain):
            return r
        assert time.monotonic() - t < 30, r
        time.sleep(0.2)


def serves_next_offset_tokens(addr, channel_credentials=None):
    """Whether the replica at `addr` takes `min_offsets` as next offsets. Describe arrived with
    that unit in the same proto change; a replica without Describe (UNIMPLEMENTED) predates it
    and reads a token as the last record wanted, so `applied` passed unchanged waits for one
    record more."""
    if channel_credentials is None:
        ch = grpc.insecure_channel(addr)
    else:
        ch = grpc.secure_channel(addr, channel_credentials)
    try:
        query_pb2_grpc.PrefixIndexStub(ch).Describe(query_pb2.DescribeRequest(), timeout=5)
        return True
    except grpc.RpcError as e:
        if e.code() == grpc.StatusCode.UNIMPLEMENTED:
            return False
        raise
    finally:
        ch.close()


def test_scores_for_resident_chain(client_factory):
    chain = last_chain()
    c = client_factory([ADDR], deadline=2.0)
    r = full_chain_answer(c, chain)
    assert r.replica_id == "py-test" and r.endpoint == ADDR
    depths = [s.depth for s in r.scores]
    assert depths == sorted(depths, reverse=True)
    assert all(0 < d <= len(chain) for d in depths)
    assert len(r.applied) == 4 and sum(o for _, o in r.applied) > 0  # 8 workers need not fill 4 partitions
    top = c.match(KS, hashes=chain, top_k=1)
    assert [s.worker for s in top.scores] == [r.scores[0].worker]
    # Read-your-writes with a token one record behind what was just observed: reached at once,
    # not stale. (Behind, because a replica that predates next-offset tokens reads `applied`
    # unchanged as one record more; test_applied_round_trips_unchanged covers the round trip.)
    again = c.match(KS, hashes=chain, min_offsets=[(p, o - 1) for p, o in r.applied if o > 0])
    assert again.outcome == "scores" and not again.stale


def test_applied_round_trips_unchanged(client_factory):
    if not serves_next_offset_tokens(ADDR):
        pytest.skip("the replica predates next-offset tokens (no Describe RPC)")
    chain = last_chain()
    c = client_factory([ADDR], deadline=5.0)
    r = full_chain_answer(c, chain)
    # Answered, not held for a record that never comes: held, the replica would answer
    # DEADLINE_EXCEEDED within the deadline and the client would fail open (no clock read).
    again = c.match(KS, hashes=chain, min_offsets=r.applied)
    assert again.outcome == "scores" and not again.stale, again


def test_statuses_fail_open(client_factory):
    c = client_factory([ADDR], deadline=2.0)
    r = c.match(("no-such-model", 64, 1), hashes=[1, 2])
    assert r.outcome == "unavailable" and r.reason.startswith("rejected: NOT_FOUND"), r
    assert "trace/bs64/scheme1" in r.reason
    r = c.match(KS, tokens=[])
    assert r.outcome == "unavailable" and "INVALID_ARGUMENT" in r.reason
    r = c.match(KS, hashes=[12345])
    assert r.outcome == "empty"
    # Tokens are hashed by the replica with the keyspace's scheme; no worker holds these.
    r = c.match(KS, tokens=list(range(128)))
    assert r.outcome == "empty"
    # Unreachable consistency token: DEADLINE_EXCEEDED -> "unavailable: timeout"; stale if allowed.
    r = c.match(KS, hashes=[1], min_offsets=[(0, 10**12)], deadline=0.3)
    assert (r.outcome, r.reason) == ("unavailable", "timeout"), r
    # allow_stale with a deadline beyond the server's max_wait (10 s): the server answers stale
    # after 10 s, well before the client's timer; a tight deadline races that timer (the
    # server's margin is at most 100 ms), which a loaded 2-core CI machine can lose.
    r = c.match(KS, hashes=[1], min_offsets=[(0, 10**12)], allow_stale=True, deadline=15.0)
    assert r.outcome == "empty" and r.stale, r


def test_dead_endpoint_fails_open_and_over(client_factory):
    # Nothing listens on port 1: "unavailable", fast, no exception.
    c = client_factory(["127.0.0.1:1"], deadline=0.05)
    t = time.monotonic()
    r = c.match(KS, hashes=[1])
    assert r.outcome == "unavailable"
    assert time.monotonic() - t < 2.0
    # A dead endpoint first, the live one second: answered within the deadline.
    r = client_factory(["127.0.0.1:1", ADDR], deadline=2.0).match(KS, hashes=last_chain())
    assert r.outcome == "scores" and r.endpoint == ADDR


def test_one_shot_match():
    r = match(ADDR, KS, deadline=2.0, hashes=last_chain(), top_k=1)
    assert r.outcome == "scores" and len(r.scores) == 1


def test_health_and_reflection():
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

    ch = grpc.insecure_channel(ADDR)
    h = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service="prefixlog.v1.PrefixIndex"), timeout=2)
    assert h.status == health_pb2.HealthCheckResponse.SERVING
    db = ProtoReflectionDescriptorDatabase(ch)
    services = db.get_services()
    assert "prefixlog.v1.PrefixIndex" in services and "grpc.health.v1.Health" in services
    fd = db.FindFileContainingSymbol("prefixlog.v1.MatchRequest")
    assert fd.name == "query.proto"
