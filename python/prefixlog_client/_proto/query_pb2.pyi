from . import records_pb2 as _records_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class EchoMessage(_message.Message):
    __slots__ = ("payload",)
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    payload: bytes
    def __init__(self, payload: _Optional[bytes] = ...) -> None: ...

class TokenIds(_message.Message):
    __slots__ = ("ids", "namespace", "cache_salt", "extra", "mm_inputs", "lookahead")
    IDS_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    CACHE_SALT_FIELD_NUMBER: _ClassVar[int]
    EXTRA_FIELD_NUMBER: _ClassVar[int]
    MM_INPUTS_FIELD_NUMBER: _ClassVar[int]
    LOOKAHEAD_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    namespace: str
    cache_salt: str
    extra: _containers.RepeatedCompositeFieldContainer[BlockExtraKeys]
    mm_inputs: _containers.RepeatedCompositeFieldContainer[MultimodalInput]
    lookahead: int
    def __init__(self, ids: _Optional[_Iterable[int]] = ..., namespace: _Optional[str] = ..., cache_salt: _Optional[str] = ..., extra: _Optional[_Iterable[_Union[BlockExtraKeys, _Mapping]]] = ..., mm_inputs: _Optional[_Iterable[_Union[MultimodalInput, _Mapping]]] = ..., lookahead: _Optional[int] = ...) -> None: ...

class MultimodalInput(_message.Message):
    __slots__ = ("id", "offset", "length")
    ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    id: str
    offset: int
    length: int
    def __init__(self, id: _Optional[str] = ..., offset: _Optional[int] = ..., length: _Optional[int] = ...) -> None: ...

class BlockExtraKeys(_message.Message):
    __slots__ = ("block", "mm_ids")
    BLOCK_FIELD_NUMBER: _ClassVar[int]
    MM_IDS_FIELD_NUMBER: _ClassVar[int]
    block: int
    mm_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, block: _Optional[int] = ..., mm_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class BlockHashes(_message.Message):
    __slots__ = ("local",)
    LOCAL_FIELD_NUMBER: _ClassVar[int]
    local: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, local: _Optional[_Iterable[int]] = ...) -> None: ...

class MatchRequest(_message.Message):
    __slots__ = ("keyspace", "tokens", "hashes", "intervals", "top_k", "lane", "min_offsets", "allow_stale", "request_id", "candidate_workers", "exclude_gapped", "in_band_errors", "unordered", "timeout_us", "tiers", "tier_weights")
    KEYSPACE_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    HASHES_FIELD_NUMBER: _ClassVar[int]
    INTERVALS_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    LANE_FIELD_NUMBER: _ClassVar[int]
    MIN_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    ALLOW_STALE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_WORKERS_FIELD_NUMBER: _ClassVar[int]
    EXCLUDE_GAPPED_FIELD_NUMBER: _ClassVar[int]
    IN_BAND_ERRORS_FIELD_NUMBER: _ClassVar[int]
    UNORDERED_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_US_FIELD_NUMBER: _ClassVar[int]
    TIERS_FIELD_NUMBER: _ClassVar[int]
    TIER_WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    keyspace: _records_pb2.Keyspace
    tokens: TokenIds
    hashes: BlockHashes
    intervals: bool
    top_k: int
    lane: int
    min_offsets: _containers.RepeatedCompositeFieldContainer[_records_pb2.PartitionOffset]
    allow_stale: bool
    request_id: int
    candidate_workers: _containers.RepeatedScalarFieldContainer[int]
    exclude_gapped: bool
    in_band_errors: bool
    unordered: bool
    timeout_us: int
    tiers: _containers.RepeatedScalarFieldContainer[_records_pb2.StorageTier]
    tier_weights: _containers.RepeatedCompositeFieldContainer[TierWeight]
    def __init__(self, keyspace: _Optional[_Union[_records_pb2.Keyspace, _Mapping]] = ..., tokens: _Optional[_Union[TokenIds, _Mapping]] = ..., hashes: _Optional[_Union[BlockHashes, _Mapping]] = ..., intervals: bool = ..., top_k: _Optional[int] = ..., lane: _Optional[int] = ..., min_offsets: _Optional[_Iterable[_Union[_records_pb2.PartitionOffset, _Mapping]]] = ..., allow_stale: bool = ..., request_id: _Optional[int] = ..., candidate_workers: _Optional[_Iterable[int]] = ..., exclude_gapped: bool = ..., in_band_errors: bool = ..., unordered: bool = ..., timeout_us: _Optional[int] = ..., tiers: _Optional[_Iterable[_Union[_records_pb2.StorageTier, str]]] = ..., tier_weights: _Optional[_Iterable[_Union[TierWeight, _Mapping]]] = ...) -> None: ...

class TierWeight(_message.Message):
    __slots__ = ("tier", "per_mille")
    TIER_FIELD_NUMBER: _ClassVar[int]
    PER_MILLE_FIELD_NUMBER: _ClassVar[int]
    tier: _records_pb2.StorageTier
    per_mille: int
    def __init__(self, tier: _Optional[_Union[_records_pb2.StorageTier, str]] = ..., per_mille: _Optional[int] = ...) -> None: ...

class TierDepth(_message.Message):
    __slots__ = ("tier", "depth", "total_blocks")
    TIER_FIELD_NUMBER: _ClassVar[int]
    DEPTH_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    tier: _records_pb2.StorageTier
    depth: int
    total_blocks: int
    def __init__(self, tier: _Optional[_Union[_records_pb2.StorageTier, str]] = ..., depth: _Optional[int] = ..., total_blocks: _Optional[int] = ...) -> None: ...

class TierRun(_message.Message):
    __slots__ = ("tier", "blocks")
    TIER_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    tier: _records_pb2.StorageTier
    blocks: int
    def __init__(self, tier: _Optional[_Union[_records_pb2.StorageTier, str]] = ..., blocks: _Optional[int] = ...) -> None: ...

class Interval(_message.Message):
    __slots__ = ("start", "end")
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    start: int
    end: int
    def __init__(self, start: _Optional[int] = ..., end: _Optional[int] = ...) -> None: ...

class WorkerScore(_message.Message):
    __slots__ = ("worker", "dp_rank", "lane", "depth", "total_blocks", "inferred", "intervals", "gapped", "tiers", "runs", "weighted_score")
    WORKER_FIELD_NUMBER: _ClassVar[int]
    DP_RANK_FIELD_NUMBER: _ClassVar[int]
    LANE_FIELD_NUMBER: _ClassVar[int]
    DEPTH_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    INFERRED_FIELD_NUMBER: _ClassVar[int]
    INTERVALS_FIELD_NUMBER: _ClassVar[int]
    GAPPED_FIELD_NUMBER: _ClassVar[int]
    TIERS_FIELD_NUMBER: _ClassVar[int]
    RUNS_FIELD_NUMBER: _ClassVar[int]
    WEIGHTED_SCORE_FIELD_NUMBER: _ClassVar[int]
    worker: int
    dp_rank: int
    lane: int
    depth: int
    total_blocks: int
    inferred: bool
    intervals: _containers.RepeatedCompositeFieldContainer[Interval]
    gapped: bool
    tiers: _containers.RepeatedCompositeFieldContainer[TierDepth]
    runs: _containers.RepeatedCompositeFieldContainer[TierRun]
    weighted_score: int
    def __init__(self, worker: _Optional[int] = ..., dp_rank: _Optional[int] = ..., lane: _Optional[int] = ..., depth: _Optional[int] = ..., total_blocks: _Optional[int] = ..., inferred: bool = ..., intervals: _Optional[_Iterable[_Union[Interval, _Mapping]]] = ..., gapped: bool = ..., tiers: _Optional[_Iterable[_Union[TierDepth, _Mapping]]] = ..., runs: _Optional[_Iterable[_Union[TierRun, _Mapping]]] = ..., weighted_score: _Optional[int] = ...) -> None: ...

class MatchResponse(_message.Message):
    __slots__ = ("scores", "applied", "replica_id", "stale", "query_blocks", "request_id", "partitions", "partition_count", "error")
    SCORES_FIELD_NUMBER: _ClassVar[int]
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    STALE_FIELD_NUMBER: _ClassVar[int]
    QUERY_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    PARTITION_COUNT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    scores: _containers.RepeatedCompositeFieldContainer[WorkerScore]
    applied: _containers.RepeatedCompositeFieldContainer[_records_pb2.PartitionOffset]
    replica_id: str
    stale: bool
    query_blocks: int
    request_id: int
    partitions: _containers.RepeatedScalarFieldContainer[int]
    partition_count: int
    error: MatchError
    def __init__(self, scores: _Optional[_Iterable[_Union[WorkerScore, _Mapping]]] = ..., applied: _Optional[_Iterable[_Union[_records_pb2.PartitionOffset, _Mapping]]] = ..., replica_id: _Optional[str] = ..., stale: bool = ..., query_blocks: _Optional[int] = ..., request_id: _Optional[int] = ..., partitions: _Optional[_Iterable[int]] = ..., partition_count: _Optional[int] = ..., error: _Optional[_Union[MatchError, _Mapping]] = ...) -> None: ...

class MatchError(_message.Message):
    __slots__ = ("code", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class DescribeRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DescribeResponse(_message.Message):
    __slots__ = ("replica_id", "topic", "partition_count", "partitions", "shard", "shard_count", "peers", "ready", "applied")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_COUNT_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    SHARD_COUNT_FIELD_NUMBER: _ClassVar[int]
    PEERS_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    topic: str
    partition_count: int
    partitions: _containers.RepeatedScalarFieldContainer[int]
    shard: int
    shard_count: int
    peers: _containers.RepeatedScalarFieldContainer[str]
    ready: bool
    applied: _containers.RepeatedCompositeFieldContainer[_records_pb2.PartitionOffset]
    def __init__(self, replica_id: _Optional[str] = ..., topic: _Optional[str] = ..., partition_count: _Optional[int] = ..., partitions: _Optional[_Iterable[int]] = ..., shard: _Optional[int] = ..., shard_count: _Optional[int] = ..., peers: _Optional[_Iterable[str]] = ..., ready: bool = ..., applied: _Optional[_Iterable[_Union[_records_pb2.PartitionOffset, _Mapping]]] = ...) -> None: ...

class ListWorkersRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WorkerInfo(_message.Message):
    __slots__ = ("worker", "partition", "metadata")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    WORKER_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    worker: int
    partition: int
    metadata: _containers.ScalarMap[str, str]
    def __init__(self, worker: _Optional[int] = ..., partition: _Optional[int] = ..., metadata: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ListWorkersResponse(_message.Message):
    __slots__ = ("workers", "partitions", "partition_count")
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    PARTITION_COUNT_FIELD_NUMBER: _ClassVar[int]
    workers: _containers.RepeatedCompositeFieldContainer[WorkerInfo]
    partitions: _containers.RepeatedScalarFieldContainer[int]
    partition_count: int
    def __init__(self, workers: _Optional[_Iterable[_Union[WorkerInfo, _Mapping]]] = ..., partitions: _Optional[_Iterable[int]] = ..., partition_count: _Optional[int] = ...) -> None: ...
