"""What the sync and the asyncio client share on the wire: building a MatchRequest from Python
arguments and turning a MatchResponse into a `MatchResult` (query.proto documents each field)."""
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from ._proto import query_pb2, records_pb2
from .tokens import Token

# (model, block size, hash scheme), e.g. ("my-model", 16, SCHEME_XXH3_CHAINED).
Keyspace = Tuple[str, int, int]


@dataclass
class Score:
    """One holder of a prefix of the prompt (a worker's data-parallel rank and lane)."""

    worker: int
    dp_rank: int
    lane: int
    depth: int  # contiguous matched blocks from position 0
    total_blocks: int  # blocks the holder holds in this keyspace
    inferred: bool  # from placements, not engine events
    intervals: List[Tuple[int, int]] = field(default_factory=list)  # half-open, with intervals=True
    # The holder's event stream lost records: its blocks may include some it no longer holds.
    gapped: bool = False
    # Storage tiers (query.proto, "Storage tiers"): per counted tier the worker holds blocks
    # on, (tier name, its own depth, its blocks); the matched prefix as (tier name, blocks)
    # runs; the tier-weighted score (with tier_weights). Empty / 0 when every holder of the
    # keyspace is on the GPU.
    tiers: List[Tuple[str, int, int]] = field(default_factory=list)
    runs: List[Tuple[str, int]] = field(default_factory=list)
    weighted_score: int = 0


# Storage tier names and their StorageTier codes (records.proto).
TIERS = {"gpu": 0, "host": 1, "disk": 2, "external": 3}
TIER_NAMES = {v: k for k, v in TIERS.items()}


def _tier_code(name) -> int:
    if isinstance(name, int):
        return name
    try:
        return TIERS[name.lower()]
    except KeyError:
        raise ValueError(f"unknown storage tier {name!r}: one of {sorted(TIERS)}") from None


@dataclass
class MatchResult:
    """A match answer, or why there is none. Never an exception: route without the index on
    anything but outcome "scores"."""

    outcome: str  # "scores" | "empty" | "unavailable"
    scores: List[Score] = field(default_factory=list)  # by depth descending
    # Next offset per partition the answer covers (see prefixlog_client.tokens): pass it
    # unchanged as a later request's `min_offsets` to read at least this state.
    applied: List[Token] = field(default_factory=list)
    replica_id: str = ""
    # With a token: it was not reached in time (allow_stale). Without one: the replica was not
    # ready, or its broker unreachable for longer than its --stale-after.
    stale: bool = False
    reason: str = ""  # for "unavailable": timeout | disconnected | overloaded | rejected: ...
    endpoint: str = ""  # the endpoint that answered (or rejected the request)
    # The partitions this answer covers (a sharded replica answers for its shard only) and the
    # log's partition count; empty / 0 from a replica that predates shard coverage.
    partitions: List[int] = field(default_factory=list)
    partition_count: int = 0
    # Sharded answers (see prefixlog_client._shards). `partial`: some partitions of the log are
    # not covered -- a shard gave no answer in time (`missing_shards`, by shard key) or no
    # shard of the map owns them; `missing_partitions` names them. Scores of the shards that
    # answered are there; workers of the missing partitions are not.
    partial: bool = False
    missing_shards: List[str] = field(default_factory=list)
    missing_partitions: List[int] = field(default_factory=list)
    # Each shard's own result by shard key (its `applied` is that shard's consistency token),
    # filled when the query fanned out to more than one shard.
    shards: Dict[str, "MatchResult"] = field(default_factory=dict)
    # Workers that two shards both reported (a protocol anomaly: a worker lives in one
    # partition); the better answer was kept.
    anomalies: int = 0


@dataclass
class WorkerInfo:
    """A worker announced by a WorkerAdded record: its partition and metadata (e.g. endpoint,
    model, pod)."""

    worker: int
    partition: int
    metadata: Dict[str, str] = field(default_factory=dict)


@dataclass
class WorkerList:
    """ListWorkers merged over the shards. Never an exception: `outcome` is "workers" (possibly
    an empty list) or "unavailable" (`reason` as for MatchResult). `partial` etc. as for
    MatchResult."""

    outcome: str  # "workers" | "unavailable"
    workers: List[WorkerInfo] = field(default_factory=list)  # ascending by worker id
    partitions: List[int] = field(default_factory=list)  # the partitions the list covers
    reason: str = ""
    partial: bool = False
    missing_shards: List[str] = field(default_factory=list)
    missing_partitions: List[int] = field(default_factory=list)
    anomalies: int = 0
    partition_count: int = 0  # of the whole log; 0 from replicas older than the field


def match_request(
    keyspace: Keyspace,
    tokens: Optional[Sequence[int]] = None,
    hashes: Optional[Sequence[int]] = None,
    namespace: str = "",
    top_k: Optional[int] = None,
    lane: Optional[int] = None,
    intervals: bool = False,
    min_offsets: Sequence[Token] = (),
    allow_stale: bool = False,
    candidate_workers: Sequence[int] = (),
    exclude_gapped: bool = False,
    tiers: Sequence = (),
    tier_weights: Optional[Dict] = None,
    cache_salt: str = "",
    extra: Sequence[Tuple[int, Sequence[str]]] = (),
    mm_inputs: Sequence[Tuple[str, int, int]] = (),
    lookahead: int = 0,
) -> query_pb2.MatchRequest:
    """The MatchRequest for one query. Exactly one prompt form: `tokens` (hashed by the replica,
    under `namespace`, `cache_salt` and the per-block keys `extra`: (block index, [multimodal
    identifier, ...]) pairs, the placed multimodal inputs `mm_inputs`: (identifier, offset, length),
    and vLLM's hash `lookahead`) or `hashes` (canonical local hashes, all of these already applied).
    `tiers`: the storage tiers that count, in preference order ("gpu", "host", "disk",
    "external"; empty: all); `tier_weights`: {tier: per mille}, answers ordered by the
    weighted score."""
    if (tokens is None) == (hashes is None):
        raise ValueError("pass exactly one of tokens= and hashes=")
    if (namespace or cache_salt or extra or mm_inputs or lookahead) and tokens is None:
        raise ValueError("namespace=, cache_salt=, extra=, mm_inputs= and lookahead= apply to tokens=; "
                         "hashes carry them already (block_hashes(..., namespace, cache_salt=, extra=, "
                         "mm_inputs=, lookahead=))")
    model, block_size, scheme = keyspace
    req = query_pb2.MatchRequest(
        keyspace=records_pb2.Keyspace(model=model, block_size=block_size, hash_scheme=scheme),
        intervals=intervals,
        allow_stale=allow_stale,
        min_offsets=[records_pb2.PartitionOffset(partition=p, offset=o) for p, o in min_offsets],
        candidate_workers=candidate_workers,
        exclude_gapped=exclude_gapped,
    )
    if tokens is not None:
        req.tokens.ids.extend(tokens)
        req.tokens.namespace = namespace
        req.tokens.cache_salt = cache_salt
        for block, ids in extra:
            req.tokens.extra.add(block=block, mm_ids=list(ids))
        for ident, offset, length in mm_inputs:
            req.tokens.mm_inputs.add(id=ident, offset=offset, length=length)
        req.tokens.lookahead = lookahead
    else:
        req.hashes.local.extend(hashes)
    if top_k is not None:
        req.top_k = top_k
    if lane is not None:
        req.lane = lane
    req.tiers.extend(_tier_code(t) for t in tiers)
    for t, per_mille in (tier_weights or {}).items():
        req.tier_weights.add(tier=_tier_code(t), per_mille=per_mille)
    return req


def match_result(resp: query_pb2.MatchResponse, endpoint: str) -> MatchResult:
    """The MatchResult of a replica's answer: "scores" when some worker holds a prefix."""
    scores = [
        Score(
            worker=s.worker,
            dp_rank=s.dp_rank,
            lane=s.lane,
            depth=s.depth,
            total_blocks=s.total_blocks,
            inferred=s.inferred,
            intervals=[(iv.start, iv.end) for iv in s.intervals],
            gapped=s.gapped,
            tiers=[(TIER_NAMES.get(t.tier, str(t.tier)), t.depth, t.total_blocks) for t in s.tiers],
            runs=[(TIER_NAMES.get(r.tier, str(r.tier)), r.blocks) for r in s.runs],
            weighted_score=s.weighted_score,
        )
        for s in resp.scores
    ]
    return MatchResult(
        "scores" if scores else "empty",
        scores=scores,
        applied=[(o.partition, o.offset) for o in resp.applied],
        replica_id=resp.replica_id,
        stale=resp.stale,
        endpoint=endpoint,
        partitions=list(resp.partitions),
        partition_count=resp.partition_count,
    )


def worker_list(resp: query_pb2.ListWorkersResponse) -> WorkerList:
    """The WorkerList of one replica's ListWorkers answer."""
    return WorkerList(
        "workers",
        workers=[WorkerInfo(w.worker, w.partition, dict(w.metadata)) for w in resp.workers],
        partitions=list(resp.partitions),
        partition_count=resp.partition_count,
    )
