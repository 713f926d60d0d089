from . import records_pb2 as _records_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DigestsRequest(_message.Message):
    __slots__ = ("partitions",)
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    partitions: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, partitions: _Optional[_Iterable[int]] = ...) -> None: ...

class DigestPointMsg(_message.Message):
    __slots__ = ("next_offset", "log_time", "digest")
    NEXT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LOG_TIME_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    next_offset: int
    log_time: int
    digest: int
    def __init__(self, next_offset: _Optional[int] = ..., log_time: _Optional[int] = ..., digest: _Optional[int] = ...) -> None: ...

class PartitionDigests(_message.Message):
    __slots__ = ("partition", "next_offset", "points")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    NEXT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    POINTS_FIELD_NUMBER: _ClassVar[int]
    partition: int
    next_offset: int
    points: _containers.RepeatedCompositeFieldContainer[DigestPointMsg]
    def __init__(self, partition: _Optional[int] = ..., next_offset: _Optional[int] = ..., points: _Optional[_Iterable[_Union[DigestPointMsg, _Mapping]]] = ...) -> None: ...

class DigestsResponse(_message.Message):
    __slots__ = ("replica_id", "topic", "partition_count", "partitions", "settings", "settings_fingerprint", "owned_partitions", "cluster_id")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_COUNT_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    SETTINGS_FIELD_NUMBER: _ClassVar[int]
    SETTINGS_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    OWNED_PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    topic: str
    partition_count: int
    partitions: _containers.RepeatedCompositeFieldContainer[PartitionDigests]
    settings: bytes
    settings_fingerprint: int
    owned_partitions: _containers.RepeatedScalarFieldContainer[int]
    cluster_id: str
    def __init__(self, replica_id: _Optional[str] = ..., topic: _Optional[str] = ..., partition_count: _Optional[int] = ..., partitions: _Optional[_Iterable[_Union[PartitionDigests, _Mapping]]] = ..., settings: _Optional[bytes] = ..., settings_fingerprint: _Optional[int] = ..., owned_partitions: _Optional[_Iterable[int]] = ..., cluster_id: _Optional[str] = ...) -> None: ...

class HolderDigestsRequest(_message.Message):
    __slots__ = ("partition",)
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    partition: int
    def __init__(self, partition: _Optional[int] = ...) -> None: ...

class HolderDigestMsg(_message.Message):
    __slots__ = ("keyspace", "worker", "dp_rank", "lane", "blocks", "digest", "fed", "gapped")
    KEYSPACE_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    DP_RANK_FIELD_NUMBER: _ClassVar[int]
    LANE_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    FED_FIELD_NUMBER: _ClassVar[int]
    GAPPED_FIELD_NUMBER: _ClassVar[int]
    keyspace: _records_pb2.Keyspace
    worker: int
    dp_rank: int
    lane: int
    blocks: int
    digest: int
    fed: bool
    gapped: bool
    def __init__(self, keyspace: _Optional[_Union[_records_pb2.Keyspace, _Mapping]] = ..., worker: _Optional[int] = ..., dp_rank: _Optional[int] = ..., lane: _Optional[int] = ..., blocks: _Optional[int] = ..., digest: _Optional[int] = ..., fed: bool = ..., gapped: bool = ...) -> None: ...

class FeedStateMsg(_message.Message):
    __slots__ = ("keyspace", "worker", "dp_rank", "epoch", "last_seq")
    KEYSPACE_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    DP_RANK_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQ_FIELD_NUMBER: _ClassVar[int]
    keyspace: _records_pb2.Keyspace
    worker: int
    dp_rank: int
    epoch: int
    last_seq: int
    def __init__(self, keyspace: _Optional[_Union[_records_pb2.Keyspace, _Mapping]] = ..., worker: _Optional[int] = ..., dp_rank: _Optional[int] = ..., epoch: _Optional[int] = ..., last_seq: _Optional[int] = ...) -> None: ...

class HolderDigestsResponse(_message.Message):
    __slots__ = ("next_offset", "holders", "feeds", "truncated")
    NEXT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    HOLDERS_FIELD_NUMBER: _ClassVar[int]
    FEEDS_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    next_offset: int
    holders: _containers.RepeatedCompositeFieldContainer[HolderDigestMsg]
    feeds: _containers.RepeatedCompositeFieldContainer[FeedStateMsg]
    truncated: bool
    def __init__(self, next_offset: _Optional[int] = ..., holders: _Optional[_Iterable[_Union[HolderDigestMsg, _Mapping]]] = ..., feeds: _Optional[_Iterable[_Union[FeedStateMsg, _Mapping]]] = ..., truncated: bool = ...) -> None: ...

class FetchCheckpointRequest(_message.Message):
    __slots__ = ("partitions",)
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    partitions: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, partitions: _Optional[_Iterable[int]] = ...) -> None: ...

class CheckpointChunk(_message.Message):
    __slots__ = ("checkpoint_id", "total_bytes", "data", "chunk_checksum", "last", "total_checksum")
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    CHUNK_CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    TOTAL_CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    checkpoint_id: int
    total_bytes: int
    data: bytes
    chunk_checksum: int
    last: bool
    total_checksum: int
    def __init__(self, checkpoint_id: _Optional[int] = ..., total_bytes: _Optional[int] = ..., data: _Optional[bytes] = ..., chunk_checksum: _Optional[int] = ..., last: bool = ..., total_checksum: _Optional[int] = ...) -> None: ...
