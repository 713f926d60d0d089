"""Both clients (sync and asyncio, through the client_factory fixture) against in-process fake
replicas: the request on the wire, the answer read back, failures mapped to fail-open outcomes,
and the deadline split over endpoints."""
import time

import grpc
import pytest

from prefixlog_client import IndexClient, match

KS = ("m", 4, 1)


def test_new_fields_cross_the_wire(fake_replica, client_factory):
    replica = fake_replica()
    c = client_factory([replica.endpoint], deadline=5.0)
    r = c.match(KS, hashes=[1, 2], candidate_workers=[7, 9], exclude_gapped=True, min_offsets=[(0, 41)], top_k=2)
    sent = replica.requests[0]
    assert list(sent.candidate_workers) == [7, 9] and sent.exclude_gapped and sent.top_k == 2
    assert [(o.partition, o.offset) for o in sent.min_offsets] == [(0, 41)]
    assert r.outcome == "scores" and r.endpoint == replica.endpoint
    assert r.scores[0].gapped and not r.scores[1].gapped
    assert (r.applied, r.partitions, r.partition_count) == ([(0, 41), (2, 7)], [0, 2], 4)
    # The answer's applied goes back out unchanged.
    c.match(KS, hashes=[1], min_offsets=r.applied)
    assert [(o.partition, o.offset) for o in replica.requests[1].min_offsets] == r.applied


@pytest.mark.parametrize(
    "code, reason",
    [
        (grpc.StatusCode.NOT_FOUND, "rejected: NOT_FOUND: no keyspace m/bs4"),
        (grpc.StatusCode.INVALID_ARGUMENT, "rejected: INVALID_ARGUMENT: no keyspace m/bs4"),
    ],
)
def test_a_rejected_request_is_not_retried_elsewhere(fake_replica, client_factory, code, reason):
    rejecting, other = fake_replica(abort=(code, "no keyspace m/bs4")), fake_replica()
    r = client_factory([rejecting.endpoint, other.endpoint], deadline=5.0).match(KS, hashes=[1])
    assert (r.outcome, r.reason, r.endpoint) == ("unavailable", reason, rejecting.endpoint)
    assert not other.requests


def test_overloaded_and_dead_endpoints_fail_over(fake_replica, client_factory):
    overloaded = fake_replica(abort=(grpc.StatusCode.RESOURCE_EXHAUSTED, "too many streams"))
    healthy = fake_replica()
    r = client_factory(["127.0.0.1:1", overloaded.endpoint, healthy.endpoint], deadline=5.0).match(KS, hashes=[1])
    assert r.outcome == "scores" and r.endpoint == healthy.endpoint
    assert len(overloaded.requests) == 1
    alone = client_factory([overloaded.endpoint], deadline=5.0).match(KS, hashes=[1])
    assert alone.outcome == "unavailable"
    assert alone.reason == f"overloaded: {overloaded.endpoint}: too many streams"


def test_a_hung_endpoint_costs_only_its_share_of_the_deadline(fake_replica, client_factory):
    hung, healthy = fake_replica(hang=True), fake_replica()
    # A deadline of seconds: the healthy fake shares the GIL with the test on a loaded machine,
    # and its half of the deadline must cover a new channel and an answer.
    c = client_factory([hung.endpoint, healthy.endpoint], deadline=4.0)
    t = time.monotonic()
    r = c.match(KS, hashes=[1])
    took = time.monotonic() - t
    assert r.outcome == "scores" and r.endpoint == healthy.endpoint, r
    assert len(hung.requests) == 1
    assert 1.6 < took < 4.0, took  # the hung one got half the deadline, the healthy one answered
    # The endpoint that answered is asked first next time (the hung one is not asked again).
    assert c.match(KS, hashes=[1]).endpoint == healthy.endpoint
    assert len(hung.requests) == 1


def test_only_hung_endpoints_time_out(fake_replica, client_factory):
    hung = fake_replica(hang=True)
    c = client_factory([hung.endpoint], deadline=0.3)
    t = time.monotonic()
    r = c.match(KS, hashes=[1])
    assert (r.outcome, r.reason) == ("unavailable", "timeout")
    assert time.monotonic() - t < 2.0  # the deadline ends it (the fake never answers)


def test_no_endpoints_is_unavailable(client_factory):
    r = client_factory([], deadline=0.1).match(KS, hashes=[1])
    assert (r.outcome, r.reason) == ("unavailable", "disconnected: no endpoints")


def test_one_endpoint_as_a_string_and_the_one_shot_helper(fake_replica):
    replica = fake_replica()
    with IndexClient(replica.endpoint, deadline=5.0) as c:
        assert c.endpoints == [replica.endpoint]
        assert c.match(KS, hashes=[1]).outcome == "scores"
    assert match(replica.endpoint, KS, deadline=5.0, tokens=[1, 2, 3, 4], namespace="a").outcome == "scores"
    assert replica.requests[-1].tokens.namespace == "a"


@pytest.mark.parametrize(
    "tls",
    [
        {"root_certificates": b"ca", "private_key": b"key"},
        {"certificate_chain": b"cert"},
        {"server_name": "localhost"},
    ],
    ids=["key-without-chain", "chain-without-key", "server-name-without-tls"],
)
def test_inconsistent_tls_options_are_refused_up_front(client_factory, tls):
    with pytest.raises(ValueError):
        client_factory(["127.0.0.1:1"], **tls)
