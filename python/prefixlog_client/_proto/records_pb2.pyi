from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class StorageTier(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STORAGE_TIER_GPU: _ClassVar[StorageTier]
    STORAGE_TIER_HOST: _ClassVar[StorageTier]
    STORAGE_TIER_DISK: _ClassVar[StorageTier]
    STORAGE_TIER_EXTERNAL: _ClassVar[StorageTier]
STORAGE_TIER_GPU: StorageTier
STORAGE_TIER_HOST: StorageTier
STORAGE_TIER_DISK: StorageTier
STORAGE_TIER_EXTERNAL: StorageTier

class Keyspace(_message.Message):
    __slots__ = ("model", "block_size", "hash_scheme")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    HASH_SCHEME_FIELD_NUMBER: _ClassVar[int]
    model: str
    block_size: int
    hash_scheme: int
    def __init__(self, model: _Optional[str] = ..., block_size: _Optional[int] = ..., hash_scheme: _Optional[int] = ...) -> None: ...

class Record(_message.Message):
    __slots__ = ("version", "kv_events", "placement", "lifecycle", "tick")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    KV_EVENTS_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_FIELD_NUMBER: _ClassVar[int]
    LIFECYCLE_FIELD_NUMBER: _ClassVar[int]
    TICK_FIELD_NUMBER: _ClassVar[int]
    version: int
    kv_events: KvEventBatch
    placement: Placement
    lifecycle: WorkerLifecycle
    tick: Tick
    def __init__(self, version: _Optional[int] = ..., kv_events: _Optional[_Union[KvEventBatch, _Mapping]] = ..., placement: _Optional[_Union[Placement, _Mapping]] = ..., lifecycle: _Optional[_Union[WorkerLifecycle, _Mapping]] = ..., tick: _Optional[_Union[Tick, _Mapping]] = ...) -> None: ...

class KvEventBatch(_message.Message):
    __slots__ = ("worker", "dp_rank", "keyspace", "epoch", "seq", "events", "gap_before", "lanes")
    WORKER_FIELD_NUMBER: _ClassVar[int]
    DP_RANK_FIELD_NUMBER: _ClassVar[int]
    KEYSPACE_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    GAP_BEFORE_FIELD_NUMBER: _ClassVar[int]
    LANES_FIELD_NUMBER: _ClassVar[int]
    worker: int
    dp_rank: int
    keyspace: Keyspace
    epoch: int
    seq: int
    events: _containers.RepeatedCompositeFieldContainer[KvEvent]
    gap_before: bool
    lanes: _containers.RepeatedCompositeFieldContainer[LaneInfo]
    def __init__(self, worker: _Optional[int] = ..., dp_rank: _Optional[int] = ..., keyspace: _Optional[_Union[Keyspace, _Mapping]] = ..., epoch: _Optional[int] = ..., seq: _Optional[int] = ..., events: _Optional[_Iterable[_Union[KvEvent, _Mapping]]] = ..., gap_before: bool = ..., lanes: _Optional[_Iterable[_Union[LaneInfo, _Mapping]]] = ...) -> None: ...

class LaneInfo(_message.Message):
    __slots__ = ("lane", "kind", "sliding_window", "block_size")
    LANE_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    SLIDING_WINDOW_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    lane: int
    kind: str
    sliding_window: int
    block_size: int
    def __init__(self, lane: _Optional[int] = ..., kind: _Optional[str] = ..., sliding_window: _Optional[int] = ..., block_size: _Optional[int] = ...) -> None: ...

class KvEvent(_message.Message):
    __slots__ = ("lane", "stored", "removed", "cleared", "tier")
    LANE_FIELD_NUMBER: _ClassVar[int]
    STORED_FIELD_NUMBER: _ClassVar[int]
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    CLEARED_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    lane: int
    stored: BlocksStored
    removed: BlocksRemoved
    cleared: AllBlocksCleared
    tier: StorageTier
    def __init__(self, lane: _Optional[int] = ..., stored: _Optional[_Union[BlocksStored, _Mapping]] = ..., removed: _Optional[_Union[BlocksRemoved, _Mapping]] = ..., cleared: _Optional[_Union[AllBlocksCleared, _Mapping]] = ..., tier: _Optional[_Union[StorageTier, str]] = ...) -> None: ...

class BlocksStored(_message.Message):
    __slots__ = ("parent_ext", "ext", "local")
    PARENT_EXT_FIELD_NUMBER: _ClassVar[int]
    EXT_FIELD_NUMBER: _ClassVar[int]
    LOCAL_FIELD_NUMBER: _ClassVar[int]
    parent_ext: int
    ext: _containers.RepeatedScalarFieldContainer[int]
    local: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, parent_ext: _Optional[int] = ..., ext: _Optional[_Iterable[int]] = ..., local: _Optional[_Iterable[int]] = ...) -> None: ...

class BlocksRemoved(_message.Message):
    __slots__ = ("ext",)
    EXT_FIELD_NUMBER: _ClassVar[int]
    ext: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ext: _Optional[_Iterable[int]] = ...) -> None: ...

class AllBlocksCleared(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Placement(_message.Message):
    __slots__ = ("worker", "dp_rank", "lane", "keyspace", "local", "answered_at", "gateway", "policy")
    WORKER_FIELD_NUMBER: _ClassVar[int]
    DP_RANK_FIELD_NUMBER: _ClassVar[int]
    LANE_FIELD_NUMBER: _ClassVar[int]
    KEYSPACE_FIELD_NUMBER: _ClassVar[int]
    LOCAL_FIELD_NUMBER: _ClassVar[int]
    ANSWERED_AT_FIELD_NUMBER: _ClassVar[int]
    GATEWAY_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    worker: int
    dp_rank: int
    lane: int
    keyspace: Keyspace
    local: _containers.RepeatedScalarFieldContainer[int]
    answered_at: _containers.RepeatedCompositeFieldContainer[PartitionOffset]
    gateway: str
    policy: str
    def __init__(self, worker: _Optional[int] = ..., dp_rank: _Optional[int] = ..., lane: _Optional[int] = ..., keyspace: _Optional[_Union[Keyspace, _Mapping]] = ..., local: _Optional[_Iterable[int]] = ..., answered_at: _Optional[_Iterable[_Union[PartitionOffset, _Mapping]]] = ..., gateway: _Optional[str] = ..., policy: _Optional[str] = ...) -> None: ...

class PartitionOffset(_message.Message):
    __slots__ = ("partition", "offset")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    partition: int
    offset: int
    def __init__(self, partition: _Optional[int] = ..., offset: _Optional[int] = ...) -> None: ...

class WorkerLifecycle(_message.Message):
    __slots__ = ("worker", "added", "removed", "restarted")
    WORKER_FIELD_NUMBER: _ClassVar[int]
    ADDED_FIELD_NUMBER: _ClassVar[int]
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    RESTARTED_FIELD_NUMBER: _ClassVar[int]
    worker: int
    added: WorkerAdded
    removed: WorkerRemoved
    restarted: WorkerRestarted
    def __init__(self, worker: _Optional[int] = ..., added: _Optional[_Union[WorkerAdded, _Mapping]] = ..., removed: _Optional[_Union[WorkerRemoved, _Mapping]] = ..., restarted: _Optional[_Union[WorkerRestarted, _Mapping]] = ...) -> None: ...

class WorkerAdded(_message.Message):
    __slots__ = ("metadata",)
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    METADATA_FIELD_NUMBER: _ClassVar[int]
    metadata: _containers.ScalarMap[str, str]
    def __init__(self, metadata: _Optional[_Mapping[str, str]] = ...) -> None: ...

class WorkerRemoved(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WorkerRestarted(_message.Message):
    __slots__ = ("new_epoch",)
    NEW_EPOCH_FIELD_NUMBER: _ClassVar[int]
    new_epoch: int
    def __init__(self, new_epoch: _Optional[int] = ...) -> None: ...

class Tick(_message.Message):
    __slots__ = ("worker",)
    WORKER_FIELD_NUMBER: _ClassVar[int]
    worker: int
    def __init__(self, worker: _Optional[int] = ...) -> None: ...
