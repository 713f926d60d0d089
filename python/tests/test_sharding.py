"""Sharded fan-out in both clients (the client_factory fixture), against in-process fake
replicas: merge, top_k after the merge, anomalies, partial answers, per-shard tokens and
candidates, NOT_FOUND from a shard that has no such keyspace, ListWorkers, discovery.

The fakes play a 4-partition log in two shards: "0/2" owns partitions 0 and 2 (workers 1, 5
in partition 0, 12, 13 in partition 2), "1/2" owns 1 and 3 (workers 3, 4 in partition 1, 2, 6
in partition 3).
"""
import os
import time

import grpc
import pytest

from fake_replica import describe, shard_response
from prefixlog_client import IndexClient, partition_of
from prefixlog_client._proto import query_pb2

KS = ("m", 4, 1)
EVEN, ODD = [0, 2], [1, 3]


def test_the_fixture_workers_live_where_the_docstring_says():
    for w, p in {1: 0, 5: 0, 12: 2, 13: 2, 3: 1, 4: 1, 2: 3, 6: 3}.items():
        assert partition_of(w, 4) == p


def two_shards(fake_replica, even_scores, odd_scores, **kw):
    """Replicas of shards 0/2 and 1/2 answering these scores; `even=` / `odd=`: more
    FakeReplica arguments for one of them."""
    even = fake_replica(**{"response": shard_response(EVEN, even_scores, replica_id="even"), "describe": describe(0, 2), **kw.get("even", {})})
    odd = fake_replica(**{"response": shard_response(ODD, odd_scores, replica_id="odd"), "describe": describe(1, 2), **kw.get("odd", {})})
    return even, odd


def summary(r):
    return [(s.worker, s.depth, s.total_blocks, s.dp_rank, s.lane) for s in r.scores]


def pause(c, seconds):
    """Waits, letting an asyncio client's loop run (its background refresh)."""
    if hasattr(type(c), "run_briefly"):
        c.run_briefly(seconds)
    else:
        time.sleep(seconds)


def test_merge_is_the_union_in_the_servers_order(fake_replica, client_factory):
    even, odd = two_shards(fake_replica, [(1, 3, 9), (12, 2, 5), (13, 2, 2, 1, 0)], [(3, 3, 4), (2, 2, 7)])
    c = client_factory(shards={"even": [even.endpoint], "odd": [odd.endpoint]}, deadline=5.0)
    r = c.match(KS, hashes=[1, 2, 3])
    assert r.outcome == "scores" and not r.partial and r.missing_shards == [] and r.anomalies == 0
    # Depth descending, then worker, dp rank, lane -- across shards.
    assert summary(r) == [(1, 3, 9, 0, 0), (3, 3, 4, 0, 0), (2, 2, 7, 0, 0), (12, 2, 5, 0, 0), (13, 2, 2, 1, 0)]
    assert r.partitions == [0, 1, 2, 3] and r.partition_count == 4
    assert r.replica_id == "even,odd" and r.endpoint == f"{even.endpoint},{odd.endpoint}"
    # Each shard was asked once, and the per-shard answers are kept.
    assert len(even.requests) == len(odd.requests) == 1
    assert set(r.shards) == {"even", "odd"} and r.shards["odd"].replica_id == "odd"


def test_ties_across_shards_break_by_worker_then_dp_rank_then_lane(fake_replica, client_factory):
    even, odd = two_shards(fake_replica, [(5, 2, 1, 1, 0), (5, 2, 1, 0, 1), (1, 2, 1, 0, 0)], [(4, 2), (3, 2, 1, 0, 2)])
    r = client_factory(shards=[[even.endpoint], [odd.endpoint]], deadline=5.0).match(KS, hashes=[1, 2])
    assert [(s.worker, s.dp_rank, s.lane) for s in r.scores] == [(1, 0, 0), (3, 0, 2), (4, 0, 0), (5, 0, 1), (5, 1, 0)]


def test_top_k_is_applied_after_the_merge(fake_replica, client_factory):
    # Each shard returns its own top 2; the merged top 2 takes the best of both.
    even, odd = two_shards(fake_replica, [(1, 5), (12, 1)], [(3, 4), (2, 3)])
    r = client_factory(shards=[[even.endpoint], [odd.endpoint]], deadline=5.0).match(KS, hashes=[1] * 5, top_k=2)
    assert [s.worker for s in r.scores] == [1, 3]
    assert even.requests[0].top_k == 2 and odd.requests[0].top_k == 2  # each shard cuts too: exact


def test_a_worker_reported_by_two_shards_is_an_anomaly_and_the_better_answer_is_kept(fake_replica, client_factory):
    even, odd = two_shards(fake_replica, [(1, 2, 8), (12, 1)], [(1, 3, 4), (3, 1)])
    c = client_factory(shards=[[even.endpoint], [odd.endpoint]], deadline=5.0)
    r = c.match(KS, hashes=[1, 2, 3])
    assert summary(r) == [(1, 3, 4, 0, 0), (3, 1, 0, 0, 0), (12, 1, 0, 0, 0)]
    assert r.anomalies == 1 and c.protocol_anomalies == 1


def test_a_hung_shard_gives_a_partial_answer_with_the_other_shards_scores(fake_replica, client_factory):
    even, odd = two_shards(fake_replica, [(1, 2), (12, 1)], [(3, 3)])
    c = client_factory(shards={"even": [even.endpoint], "odd": [odd.endpoint]}, deadline=0.5)
    r = c.match(KS, hashes=[1, 2, 3])
    assert not r.partial
    odd.hang = True
    r = c.match(KS, hashes=[1, 2, 3])
    assert r.outcome == "scores" and r.partial
    assert r.missing_shards == ["odd"] and r.missing_partitions == [1, 3]
    assert summary(r) == [(1, 2, 0, 0, 0), (12, 1, 0, 0, 0)]  # never a worker of the missing shard
    assert r.reason == "partial: odd: timeout" and r.partitions == [0, 2]
    assert r.applied == [(0, 10), (2, 12)]  # the answering shard's token only
    assert r.shards["odd"].outcome == "unavailable"


def test_a_dead_shard_never_raises_and_no_shard_is_unavailable(fake_replica, client_factory):
    even, _ = two_shards(fake_replica, [(1, 2)], [(3, 3)])
    c = client_factory(shards={"even": [even.endpoint], "odd": ["127.0.0.1:1"]}, deadline=2.0)
    r = c.match(KS, hashes=[1, 2])
    assert r.outcome == "scores" and r.partial and r.missing_shards == ["odd"]
    assert r.reason.startswith("partial: odd: disconnected: 127.0.0.1:1")
    # Partitions of a shard never heard from are named once the log's count is known.
    assert r.missing_partitions == [1, 3]
    r = client_factory(shards={"a": ["127.0.0.1:1"], "b": ["127.0.0.1:2"]}, deadline=0.5).match(KS, hashes=[1])
    assert r.outcome == "unavailable" and r.partial and r.missing_shards == ["a", "b"]
    assert r.reason.startswith("disconnected: 127.0.0.1:1")


def test_replica_failover_within_a_shard(fake_replica, client_factory):
    even, odd = two_shards(fake_replica, [(1, 2)], [(3, 3)])
    overloaded = fake_replica(abort=(grpc.StatusCode.RESOURCE_EXHAUSTED, "busy"))
    c = client_factory(shards=[["127.0.0.1:1", even.endpoint], [overloaded.endpoint, odd.endpoint]], deadline=5.0)
    r = c.match(KS, hashes=[1, 2, 3])
    assert not r.partial and [s.worker for s in r.scores] == [3, 1]
    assert len(overloaded.requests) == 1
    c.match(KS, hashes=[1, 2, 3])  # the replica that answered is asked first next time
    assert len(overloaded.requests) == 1 and len(odd.requests) == 2


def test_tokens_and_candidates_go_to_their_shards(fake_replica, client_factory):
    even, odd = two_shards(fake_replica, [(1, 2)], [(3, 3)])
    c = client_factory(shards={"even": [even.endpoint], "odd": [odd.endpoint]}, deadline=5.0)
    first = c.match(KS, hashes=[1, 2, 3])
    assert first.shards["even"].applied == [(0, 10), (2, 12)] and first.shards["odd"].applied == [(1, 11), (3, 13)]
    assert first.applied == [(0, 10), (1, 11), (2, 12), (3, 13)]  # one token covering every partition
    # Sent back unchanged: each shard gets its own partitions' offsets (it would ignore the others).
    c.match(KS, hashes=[1], min_offsets=first.applied, candidate_workers=[1, 12, 3])
    sent = {name: r.requests[-1] for name, r in (("even", even), ("odd", odd))}
    assert [(o.partition, o.offset) for o in sent["even"].min_offsets] == [(0, 10), (2, 12)]
    assert [(o.partition, o.offset) for o in sent["odd"].min_offsets] == [(1, 11), (3, 13)]
    assert list(sent["even"].candidate_workers) == [1, 12] and list(sent["odd"].candidate_workers) == [3]
    # A shard none of whose workers is a candidate is not asked (an empty list means "all").
    before = len(odd.requests)
    r = c.match(KS, hashes=[1], candidate_workers=[5])
    assert len(odd.requests) == before and not r.partial and r.shards["odd"].outcome == "empty"
    assert [s.worker for s in r.scores] == [1]  # the fake ignores candidates; the shard was asked


def test_a_keyspace_unknown_to_one_shard_is_empty_there_and_unknown_to_all_is_rejected(fake_replica, client_factory):
    not_found = (grpc.StatusCode.NOT_FOUND, "no keyspace m/bs4")
    even, odd = two_shards(fake_replica, [(1, 2)], [], odd={"abort": not_found})
    c = client_factory(shards={"even": [even.endpoint], "odd": [odd.endpoint]}, deadline=5.0)
    r = c.match(KS, hashes=[1, 2])
    assert r.outcome == "scores" and not r.partial and [s.worker for s in r.scores] == [1]
    even.abort = not_found
    r = c.match(KS, hashes=[1, 2])
    assert (r.outcome, r.reason) == ("unavailable", "rejected: NOT_FOUND: no keyspace m/bs4")


def test_list_workers_merges_the_shards(fake_replica, client_factory):
    def listing(partitions, workers):
        return query_pb2.ListWorkersResponse(
            workers=[query_pb2.WorkerInfo(worker=w, partition=partition_of(w, 4), metadata={"endpoint": f"http://w{w}"})
                     for w in workers],
            partitions=partitions,
        )

    even, odd = two_shards(fake_replica, [], [])
    even.workers, odd.workers = listing(EVEN, [1, 12]), listing(ODD, [2, 3])
    c = client_factory(shards=[[even.endpoint], [odd.endpoint]], deadline=0.002)
    got = c.list_workers(deadline=5.0)
    assert got.outcome == "workers" and not got.partial
    assert [(w.worker, w.partition, w.metadata["endpoint"]) for w in got.workers] == [
        (1, 0, "http://w1"), (2, 3, "http://w2"), (3, 1, "http://w3"), (12, 2, "http://w12")]
    assert got.partitions == [0, 1, 2, 3]
    odd.hang = True
    got = c.list_workers(deadline=0.5)
    assert got.outcome == "workers" and got.partial and got.missing_shards == ["1"] and got.missing_partitions == [1, 3]
    assert [w.worker for w in got.workers] == [1, 12]
    single = client_factory([even.endpoint]).list_workers(deadline=5.0)
    assert single.outcome == "workers" and [w.worker for w in single.workers] == [1, 12]


def test_one_sharded_replica_alone_is_flagged_partial(fake_replica, client_factory):
    even, _ = two_shards(fake_replica, [(1, 2)], [])
    r = client_factory([even.endpoint], deadline=5.0).match(KS, hashes=[1, 2])
    assert r.outcome == "scores" and r.partial and r.missing_partitions == [1, 3] and r.missing_shards == []


def test_the_unsharded_client_sends_the_request_as_given(fake_replica, client_factory):
    # One shard: no Describe, no fan-out, tokens and candidates untouched (even those of
    # partitions the replica turns out not to own), no per-shard results.
    even, _ = two_shards(fake_replica, [(1, 2)], [])
    c = client_factory([even.endpoint], deadline=5.0)
    for _ in range(2):  # the second time the client knows the replica's partitions
        r = c.match(KS, hashes=[1], min_offsets=[(0, 1), (1, 1)], candidate_workers=[1, 3])
        sent = even.requests[-1]
        assert [(o.partition, o.offset) for o in sent.min_offsets] == [(0, 1), (1, 1)]
        assert list(sent.candidate_workers) == [1, 3]
        assert r.shards == {} and r.endpoint == even.endpoint
    assert even.describes == 0 and len(even.requests) == 2


def test_discovery_groups_replicas_by_their_partitions(fake_replica, client_factory):
    even_a, odd_a = two_shards(fake_replica, [(1, 2)], [(3, 3)])
    even_b = fake_replica(response=shard_response(EVEN, [(1, 2)]), describe=describe(0, 2, ready=False))
    odd_b = fake_replica(response=shard_response(ODD, [(3, 3)]), describe=describe(1, 2))
    seeds = [even_b.endpoint, odd_a.endpoint, even_a.endpoint, odd_b.endpoint, "127.0.0.1:1"]
    c = client_factory(seeds, discover=True, deadline=5.0)
    r = c.match(KS, hashes=[1, 2, 3])
    assert r.outcome == "scores" and not r.partial and [s.worker for s in r.scores] == [3, 1]
    # Ready replicas first, then the caller's order; the dead endpoint is in no shard.
    assert [(s.key, s.endpoints, sorted(s.partitions)) for s in c.shards] == [
        ("0/2", [even_a.endpoint, even_b.endpoint], EVEN),
        ("1/2", [odd_a.endpoint, odd_b.endpoint], ODD),
    ]
    assert not even_b.requests


def test_discovery_during_resharding_prefers_the_complete_ready_layout_with_more_shards(fake_replica, client_factory):
    whole = fake_replica(response=shard_response([0, 1, 2, 3], [(1, 2)]), describe=describe(0, 1))
    even, odd = two_shards(fake_replica, [(1, 2)], [(3, 3)], odd={"describe": describe(1, 2, ready=False)})
    c = client_factory([whole.endpoint, even.endpoint, odd.endpoint], discover=True, deadline=5.0)
    c.match(KS, hashes=[1])
    assert [s.key for s in c.shards] == ["0/1"]  # the 2-shard layout is not ready yet
    odd.describe = describe(1, 2)
    assert c.refresh()
    assert [s.key for s in c.shards] == ["0/2", "1/2"]
    # An old replica without Describe serves every partition.
    old = fake_replica(response=shard_response([], [(1, 2)], partition_count=0))
    c = client_factory([old.endpoint], discover=True, deadline=5.0)
    r = c.match(KS, hashes=[1])
    assert [s.key for s in c.shards] == ["all"] and r.outcome == "scores" and not r.partial


def test_discovery_with_no_answer_is_unavailable_then_retried(fake_replica, client_factory):
    c = client_factory(["127.0.0.1:1"], discover=True, deadline=0.5, refresh_interval=30.0, discovery_timeout=0.5)
    r = c.match(KS, hashes=[1])
    assert r.outcome == "unavailable" and r.reason.startswith("disconnected: no shard map")
    assert c.list_workers().outcome == "unavailable"


def test_a_failed_shard_triggers_a_background_refresh(fake_replica, client_factory):
    even, odd = two_shards(fake_replica, [(1, 2)], [(3, 3)])
    spare = fake_replica(response=shard_response(ODD, [(3, 3)], replica_id="spare"), describe=None)
    c = client_factory([even.endpoint, odd.endpoint, spare.endpoint], discover=True, deadline=1.0, refresh_interval=3600)
    c.match(KS, hashes=[1])
    assert [s.key for s in c.shards] == ["0/2", "1/2"]
    assert spare.endpoint not in c.shards[1].endpoints  # its Describe is UNIMPLEMENTED: "all" layout, not chosen
    spare.describe = describe(1, 2)
    odd.stop()
    describes = spare.describes
    r = c.match(KS, hashes=[1])  # shard 1/2 has no replica answering: partial, and a refresh is wanted
    assert r.partial and r.missing_shards == ["1/2"]
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        pause(c, 0.2)
        r = c.match(KS, hashes=[1])  # the refresh runs at most once a second, in the background
        if not r.partial:
            break
    assert not r.partial and r.shards["1/2"].replica_id == "spare", r
    assert spare.describes > describes


@pytest.mark.parametrize(
    "kw",
    [
        {"endpoints": ["a:1"], "shards": [["b:1"]]},
        {"shards": [["a:1"], []]},
        {"shards": [["a:1"], ["a:1"]]},
        {"shards": "a:1"},
        {"shards": [["a:1"]], "discover": True},
    ],
    ids=["endpoints-and-shards", "empty-shard", "endpoint-in-two-shards", "string", "static-and-discover"],
)
def test_bad_shard_maps_are_refused_up_front(kw):
    with pytest.raises(ValueError):
        IndexClient(**kw)


def test_a_shard_with_no_replica_answering_describe_is_still_named(fake_replica, client_factory):
    even, _ = two_shards(fake_replica, [(1, 2)], [])
    c = client_factory([even.endpoint, "127.0.0.1:1"], discover=True, deadline=2.0)
    r = c.match(KS, hashes=[1, 2])
    # Shard 0/2's Describe says the log has two shards: 1/2 is missing, not forgotten.
    assert [(s.key, s.endpoints, sorted(s.partitions)) for s in c.shards] == [
        ("0/2", [even.endpoint], EVEN), ("1/2", [], ODD)]
    assert r.outcome == "scores" and r.partial and r.missing_shards == ["1/2"] and r.missing_partitions == ODD
    assert r.reason == "partial: 1/2: disconnected: no endpoints"


def test_a_refresh_keeps_the_endpoints_of_a_shard_that_stopped_answering(fake_replica, client_factory):
    even, odd = two_shards(fake_replica, [(1, 2)], [(3, 3)])
    c = client_factory([even.endpoint, odd.endpoint], discover=True, deadline=2.0, discovery_timeout=0.3)
    c.match(KS, hashes=[1])
    odd.hang = True  # answers neither Describe nor Match
    describes = odd.describes
    assert c.refresh()
    assert odd.describes == describes + 1
    assert [(s.key, s.endpoints) for s in c.shards] == [("0/2", [even.endpoint]), ("1/2", [odd.endpoint])]
    r = c.match(KS, hashes=[1], deadline=0.5)
    assert r.partial and r.missing_shards == ["1/2"] and r.reason == "partial: 1/2: timeout"


def test_concurrent_first_queries_of_the_asyncio_client_share_one_discovery(fake_replica):
    import asyncio

    from prefixlog_client import AsyncIndexClient

    even, odd = two_shards(fake_replica, [(1, 2)], [(3, 3)])

    async def run():
        async with AsyncIndexClient([even.endpoint, odd.endpoint], discover=True, deadline=5.0) as c:
            return await asyncio.gather(*(c.match(KS, hashes=[1]) for _ in range(5)))

    # Not entered first: the client is built, then five queries race its discovery.
    async def race():
        c = AsyncIndexClient([even.endpoint, odd.endpoint], discover=True, deadline=5.0)
        try:
            return await asyncio.gather(*(c.match(KS, hashes=[1]) for _ in range(5)))
        finally:
            await c.close()

    for results in (asyncio.run(run()), asyncio.run(race())):
        assert all(r.outcome == "scores" and not r.partial for r in results), results
    assert even.describes == 2 and odd.describes == 2  # once per client


def test_a_replica_older_than_describe_joins_the_unsharded_replicas(fake_replica, client_factory):
    new = fake_replica(response=shard_response([0, 1, 2, 3], [(1, 2)]), describe=describe(0, 1))
    old = fake_replica(response=shard_response([], [(1, 2)], partition_count=0))
    c = client_factory([old.endpoint, new.endpoint], discover=True, deadline=5.0)
    r = c.match(KS, hashes=[1])
    assert [(s.key, s.endpoints) for s in c.shards] == [("0/1", [old.endpoint, new.endpoint])]
    assert r.outcome == "scores" and not r.partial and r.anomalies == 0


def tls_fixture(name):
    with open(os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures", "tls", name), "rb") as f:
        return f.read()


def behind_one_name(fake_replica, **kw):
    """Shard 0/2 on 127.0.0.11 and shard 1/2 on 127.0.0.12, one port: what a headless
    Service's name resolves to."""
    even = fake_replica(response=shard_response(EVEN, [(1, 2)], replica_id="even"), describe=describe(0, 2),
                        address="127.0.0.11:0", **kw)
    odd = fake_replica(response=shard_response(ODD, [(3, 3)], replica_id="odd"), describe=describe(1, 2),
                       address=f"127.0.0.12:{even.port}", **kw)
    return even, odd


def test_discovery_asks_every_address_a_seed_name_resolves_to(fake_replica, client_factory):
    even, odd = behind_one_name(fake_replica)
    calls = []
    behind = ["127.0.0.12", "127.0.0.11"]

    def resolver(host, port):
        calls.append((host, port))
        return behind if host == "shards.test" else []

    c = client_factory([f"shards.test:{even.port}"], discover=True, deadline=5.0, resolver=resolver)
    r = c.match(KS, hashes=[1, 2, 3])
    assert r.outcome == "scores" and not r.partial and [s.worker for s in r.scores] == [3, 1], r
    assert [(s.key, s.endpoints) for s in c.shards] == [("0/2", [even.endpoint]), ("1/2", [odd.endpoint])]
    assert calls == [("shards.test", even.port)]
    # Re-resolved on every refresh: a replica that appears behind the name joins its shard.
    spare = fake_replica(response=shard_response(ODD, [(3, 3)]), describe=describe(1, 2), address=f"127.0.0.13:{even.port}")
    behind.append("127.0.0.13")
    assert c.refresh()
    assert [s.endpoints for s in c.shards] == [[even.endpoint], [odd.endpoint, spare.endpoint]]


def test_a_name_that_reaches_one_shard_gives_partial_answers_not_errors(fake_replica, client_factory):
    """A cluster-IP Service: the name reaches one pod per connection, here always shard 0's."""
    even, _odd = behind_one_name(fake_replica)
    c = client_factory([f"shards.test:{even.port}"], discover=True, deadline=2.0,
                       resolver=lambda host, port: ["127.0.0.11"])
    r = c.match(KS, hashes=[1, 2, 3])
    assert r.outcome == "scores" and r.partial and r.missing_partitions == ODD, r


def test_discovery_over_tls_checks_resolved_addresses_against_the_seed_name(fake_replica, client_factory):
    creds = grpc.ssl_server_credentials([(tls_fixture("server.key"), tls_fixture("server.pem"))])
    even, odd = behind_one_name(fake_replica, credentials=creds)
    # The certificate names localhost and 127.0.0.1, not 127.0.0.11 / .12: only the seed's
    # name makes the handshake succeed.
    c = client_factory([f"localhost:{even.port}"], discover=True, deadline=5.0, root_certificates=tls_fixture("ca.pem"),
                       resolver=lambda host, port: ["127.0.0.11", "127.0.0.12"])
    r = c.match(KS, hashes=[1, 2, 3])
    assert r.outcome == "scores" and not r.partial and [s.worker for s in r.scores] == [3, 1], r


def test_seeds_expand_to_every_address_in_the_callers_order():
    from prefixlog_client._seeds import expand

    def resolver(host, port):
        if host == "gone.test":
            raise OSError("no such host")
        return {"shards.test": ["10.0.0.9", "10.0.0.10", "10.0.0.9"], "v6.test": ["::1"]}.get(host, [])

    e = expand(["10.0.0.1:5", "shards.test:7", "v6.test:7", "gone.test:7", "dns:///x:1", "shards.test:7"], resolver)
    assert e.endpoints == ["10.0.0.1:5", "10.0.0.9:7", "10.0.0.10:7", "[::1]:7", "gone.test:7", "dns:///x:1"]
    assert e.server_names == {"10.0.0.9:7": "shards.test", "10.0.0.10:7": "shards.test", "[::1]:7": "v6.test"}
