"""Building MatchRequests and reading MatchResponses (shared by both clients; no server)."""
import pytest

from fake_replica import canned_response
from prefixlog_client import Score
from prefixlog_client._wire import match_request, match_result

KS = ("m", 4, 1)


def test_token_prompt_carries_its_namespace():
    req = match_request(KS, tokens=[1, 2, 3, 4], namespace="sql-adapter")
    assert req.WhichOneof("prompt") == "tokens"
    assert list(req.tokens.ids) == [1, 2, 3, 4] and req.tokens.namespace == "sql-adapter"
    assert match_request(KS, tokens=[1, 2, 3, 4]).tokens.namespace == ""
    assert (req.keyspace.model, req.keyspace.block_size, req.keyspace.hash_scheme) == KS


def test_token_prompt_carries_its_salt_and_multimodal_ids():
    req = match_request(KS, tokens=list(range(8)), cache_salt="tenant", extra=[(1, ["img-a", "img-b"])])
    assert req.tokens.cache_salt == "tenant"
    assert [(e.block, list(e.mm_ids)) for e in req.tokens.extra] == [(1, ["img-a", "img-b"])]
    plain = match_request(KS, tokens=[1, 2, 3, 4]).tokens
    assert plain.cache_salt == "" and len(plain.extra) == 0


def test_every_option_reaches_the_request():
    req = match_request(
        KS, hashes=[2**64 - 1, 5], top_k=3, lane=0, intervals=True, min_offsets=[(0, 41), (2, 7)],
        allow_stale=True, candidate_workers=[7, 2**64 - 1], exclude_gapped=True,
    )
    assert req.WhichOneof("prompt") == "hashes" and list(req.hashes.local) == [2**64 - 1, 5]
    assert req.HasField("top_k") and req.top_k == 3
    assert req.HasField("lane") and req.lane == 0  # lane 0 is a filter, not "unset"
    assert req.intervals and req.allow_stale and req.exclude_gapped
    assert [(o.partition, o.offset) for o in req.min_offsets] == [(0, 41), (2, 7)]
    assert list(req.candidate_workers) == [7, 2**64 - 1]


def test_defaults_leave_optional_fields_unset():
    req = match_request(KS, hashes=[1])
    assert not req.HasField("top_k") and not req.HasField("lane")
    assert not req.min_offsets and not req.candidate_workers
    assert not (req.intervals or req.allow_stale or req.exclude_gapped)


@pytest.mark.parametrize(
    "kw",
    [{}, {"tokens": [1], "hashes": [1]}, {"hashes": [1], "namespace": "adapter"},
     {"hashes": [1], "cache_salt": "s"}, {"hashes": [1], "extra": [(0, ["img"])]}],
    ids=["no-prompt", "two-prompts", "namespace-with-hashes", "salt-with-hashes", "extra-with-hashes"],
)
def test_ambiguous_prompts_are_caller_errors(kw):
    with pytest.raises(ValueError):
        match_request(KS, **kw)


def test_response_fields_reach_the_result():
    r = match_result(canned_response(), "host:1")
    assert r.outcome == "scores" and r.endpoint == "host:1" and r.replica_id == "fake" and r.stale
    assert r.scores[0] == Score(7, 1, 2, 3, 9, True, [(0, 3)], gapped=True)
    assert r.scores[1].worker == 2**64 - 1 and not r.scores[1].gapped
    assert r.applied == [(0, 41), (2, 7)]
    assert (r.partitions, r.partition_count) == ([0, 2], 4)


def test_applied_round_trips_unchanged_into_min_offsets():
    applied = match_result(canned_response(), "host:1").applied
    req = match_request(KS, hashes=[1], min_offsets=applied)
    assert [(o.partition, o.offset) for o in req.min_offsets] == applied


def test_no_scores_is_empty():
    resp = canned_response()
    del resp.scores[:]
    assert match_result(resp, "host:1").outcome == "empty"


def test_tier_order_and_weights_reach_the_request_and_tiered_scores_the_result():
    from prefixlog_client._proto import query_pb2

    req = match_request(KS, hashes=[1], tiers=["host", "GPU", 2], tier_weights={"gpu": 1000, "host": 600})
    assert list(req.tiers) == [1, 0, 2]
    assert [(w.tier, w.per_mille) for w in req.tier_weights] == [(0, 1000), (1, 600)]
    with pytest.raises(ValueError, match="unknown storage tier"):
        match_request(KS, hashes=[1], tiers=["tape"])
    resp = query_pb2.MatchResponse(scores=[query_pb2.WorkerScore(
        worker=7, depth=3, weighted_score=2200,
        tiers=[query_pb2.TierDepth(tier=0, depth=1, total_blocks=5), query_pb2.TierDepth(tier=1, depth=3, total_blocks=9)],
        runs=[query_pb2.TierRun(tier=0, blocks=1), query_pb2.TierRun(tier=1, blocks=2)],
    )])
    s = match_result(resp, "e").scores[0]
    assert (s.tiers, s.runs, s.weighted_score) == ([("gpu", 1, 5), ("host", 3, 9)], [("gpu", 1), ("host", 2)], 2200)
