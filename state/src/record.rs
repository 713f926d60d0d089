//! Log records: encoding for publishers, decoding and validation for replicas.
//!
//! Decoding turns bytes into an [`Op`] or a [`BadReason`]; nothing here panics on any input.

/// Named here beside [`KvOp`], whose stores and removals carry one.
pub use prefixlog_engine::Tier;
use prefixlog_engine::{partition_of, BlockHashes, HolderKey, KeyspaceId};
use prefixlog_ids::NextOffset;
use prefixlog_proto::v1 as pb;
use prefixlog_proto::RECORD_VERSION;
use prost::Message;

/// Why a record was skipped. Each reason is a metric label. Checkpoints store a reason by its
/// place in this list (serde's variant index): add new reasons at the end.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub enum BadReason {
    /// Not a protobuf `Record` (or no value at all).
    Undecodable,
    /// A schema version this build does not know.
    UnknownVersion,
    /// No kind set: a kind added by a newer writer, or an empty record.
    UnknownKind,
    /// A KV event with no event set (a newer event type).
    UnknownEvent,
    /// Keyspace missing, or block size 0, or empty model.
    InvalidKeyspace,
    /// `ext` and `local` of a stored event differ in length.
    LengthMismatch,
    /// More blocks than the configured per-record limit.
    TooManyBlocks,
    /// The record's worker does not belong to the partition it was read from (a publisher
    /// not using `partition_of`); applying it would break per-worker ordering.
    WrongPartition,
    /// It would put the partition's feeds and holders in more keyspaces than the limit
    /// (`max_keyspaces_per_partition`; the limits are in `crate::limits`).
    TooManyKeyspaces,
    /// It would start a feed beyond the partition's limit (`max_feeds_per_partition`).
    TooManyFeeds,
    /// It would give its feed more lanes than the limit (`max_lanes_per_feed`).
    TooManyLanes,
    /// It would create holders beyond the partition's limit (`max_holders_per_partition`).
    TooManyHolders,
    /// It announces a worker beyond the partition's limit (`max_workers_per_partition`).
    TooManyWorkers,
    /// Its worker metadata is larger than the limit (`max_worker_metadata_bytes`).
    MetadataTooLarge,
    /// Its model name or a lane kind is longer than the limit (`max_name_bytes`).
    NameTooLong,
    /// A stored or removed event names a storage tier outside the enumeration this build knows
    /// (a newer writer's tier): crediting it to some other tier would overcount.
    UnknownTier,
}

impl BadReason {
    pub fn as_str(self) -> &'static str {
        match self {
            BadReason::Undecodable => "undecodable",
            BadReason::UnknownVersion => "unknown_version",
            BadReason::UnknownKind => "unknown_kind",
            BadReason::UnknownEvent => "unknown_event",
            BadReason::InvalidKeyspace => "invalid_keyspace",
            BadReason::LengthMismatch => "length_mismatch",
            BadReason::TooManyBlocks => "too_many_blocks",
            BadReason::WrongPartition => "wrong_partition",
            BadReason::TooManyKeyspaces => "too_many_keyspaces",
            BadReason::TooManyFeeds => "too_many_feeds",
            BadReason::TooManyLanes => "too_many_lanes",
            BadReason::TooManyHolders => "too_many_holders",
            BadReason::TooManyWorkers => "too_many_workers",
            BadReason::MetadataTooLarge => "metadata_too_large",
            BadReason::NameTooLong => "name_too_long",
            BadReason::UnknownTier => "unknown_tier",
        }
    }

    /// Every reason, in the order checkpoints number them: append only.
    pub const ALL: [BadReason; 16] = [
        BadReason::Undecodable,
        BadReason::UnknownVersion,
        BadReason::UnknownKind,
        BadReason::UnknownEvent,
        BadReason::InvalidKeyspace,
        BadReason::LengthMismatch,
        BadReason::TooManyBlocks,
        BadReason::WrongPartition,
        BadReason::TooManyKeyspaces,
        BadReason::TooManyFeeds,
        BadReason::TooManyLanes,
        BadReason::TooManyHolders,
        BadReason::TooManyWorkers,
        BadReason::MetadataTooLarge,
        BadReason::NameTooLong,
        BadReason::UnknownTier,
    ];
}

impl std::fmt::Display for BadReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Metadata of one lane (a hybrid model's cache group), kept per feed.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LaneMeta {
    pub lane: u32,
    pub kind: String,
    pub sliding_window: u32,
    pub block_size: u32,
}

/// One KV event of a batch, validated. Stores and removals name the tier they happen on (a
/// holder per tier); a clear empties every tier of the lane (an engine's reset: conservative,
/// it never leaves a block credited that the reset may have dropped).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KvOp {
    Stored { tier: Tier, lane: u32, parent_ext: Option<u64>, blocks: Vec<BlockHashes> },
    Removed { tier: Tier, lane: u32, exts: Vec<u64> },
    Cleared { lane: u32 },
}

impl KvOp {
    pub fn lane(&self) -> u32 {
        match self {
            KvOp::Stored { lane, .. } | KvOp::Removed { lane, .. } | KvOp::Cleared { lane } => *lane,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Lifecycle {
    /// The worker joined; `metadata` (pod name, endpoint, model, ...) is what `ListWorkers`
    /// reports.
    Added {
        metadata: std::collections::BTreeMap<String, String>,
    },
    Removed,
    Restarted {
        new_epoch: u64,
    },
}

/// A validated record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    KvEvents {
        keyspace: KeyspaceId,
        worker: u64,
        dp_rank: u32,
        epoch: u64,
        seq: u64,
        gap_before: bool,
        events: Vec<KvOp>,
        lanes: Vec<LaneMeta>,
    },
    Placement {
        keyspace: KeyspaceId,
        holder: HolderKey,
        locals: Vec<u64>,
        answered_at: Vec<NextOffset>,
        /// The gateway that published it (audits only; not applied).
        gateway: String,
        /// The routing policy it names, empty when none (audits only; not applied).
        policy: String,
    },
    Lifecycle {
        worker: u64,
        change: Lifecycle,
    },
    Tick {
        worker: u64,
    },
}

impl Op {
    pub fn worker(&self) -> u64 {
        match self {
            Op::KvEvents { worker, .. } | Op::Lifecycle { worker, .. } | Op::Tick { worker } => *worker,
            Op::Placement { holder, .. } => holder.worker,
        }
    }
}

fn keyspace(k: Option<&pb::Keyspace>) -> Result<KeyspaceId, BadReason> {
    match k {
        Some(k) if k.block_size > 0 && !k.model.is_empty() => {
            Ok(KeyspaceId::new(k.model.clone(), k.block_size, k.hash_scheme))
        }
        _ => Err(BadReason::InvalidKeyspace),
    }
}

/// Whether a record value is a placement, without decoding it (its top-level fields walked,
/// their bodies skipped): audits that judge placements pass over KV event batches at the cost
/// of a few varints. A `true` still needs [`decode`] to be valid.
pub fn is_placement(value: &[u8]) -> bool {
    use prost::encoding::{decode_key, decode_varint, WireType};
    const PLACEMENT_FIELD: u32 = 11;
    let mut buf = value;
    while !buf.is_empty() {
        let Ok((field, wire)) = decode_key(&mut buf) else { return false };
        if field == PLACEMENT_FIELD {
            return true;
        }
        let Ok(v) = decode_varint(&mut buf) else { return false };
        if wire == WireType::LengthDelimited {
            let Some(rest) = usize::try_from(v).ok().and_then(|n| buf.get(n..)) else { return false };
            buf = rest;
        } else if wire != WireType::Varint {
            return false;
        }
    }
    false
}

/// Decodes and validates a record value read from `partition` (of `partitions`).
pub fn decode(
    value: Option<&[u8]>,
    partition: u32,
    partitions: u32,
    max_blocks: usize,
) -> Result<Op, BadReason> {
    let rec = pb::Record::decode(value.ok_or(BadReason::Undecodable)?).map_err(|_| BadReason::Undecodable)?;
    if rec.version != RECORD_VERSION {
        return Err(BadReason::UnknownVersion);
    }
    let op = match rec.kind.ok_or(BadReason::UnknownKind)? {
        pb::record::Kind::KvEvents(b) => {
            let keyspace = keyspace(b.keyspace.as_ref())?;
            let mut total = 0usize;
            let mut events = Vec::with_capacity(b.events.len());
            for e in b.events {
                let lane = e.lane;
                let known = u32::try_from(e.tier).ok().and_then(Tier::from_code);
                let tier = || known.ok_or(BadReason::UnknownTier);
                events.push(match e.event.ok_or(BadReason::UnknownEvent)? {
                    pb::kv_event::Event::Stored(s) => {
                        if s.ext.len() != s.local.len() {
                            return Err(BadReason::LengthMismatch);
                        }
                        total += s.ext.len();
                        KvOp::Stored {
                            tier: tier()?,
                            lane,
                            parent_ext: s.parent_ext,
                            blocks: s.ext.into_iter().zip(s.local).map(BlockHashes::from).collect(),
                        }
                    }
                    pb::kv_event::Event::Removed(r) => {
                        total += r.ext.len();
                        KvOp::Removed { tier: tier()?, lane, exts: r.ext }
                    }
                    pb::kv_event::Event::Cleared(_) => KvOp::Cleared { lane },
                });
                if total > max_blocks {
                    return Err(BadReason::TooManyBlocks);
                }
            }
            Op::KvEvents {
                keyspace,
                worker: b.worker,
                dp_rank: b.dp_rank,
                epoch: b.epoch,
                seq: b.seq,
                gap_before: b.gap_before,
                events,
                lanes: b
                    .lanes
                    .into_iter()
                    .map(|l| LaneMeta {
                        lane: l.lane,
                        kind: l.kind,
                        sliding_window: l.sliding_window,
                        block_size: l.block_size,
                    })
                    .collect(),
            }
        }
        pb::record::Kind::Placement(p) => {
            if p.local.len() > max_blocks {
                return Err(BadReason::TooManyBlocks);
            }
            Op::Placement {
                keyspace: keyspace(p.keyspace.as_ref())?,
                holder: HolderKey::new(p.worker, p.dp_rank, p.lane),
                locals: p.local,
                answered_at: p.answered_at.iter().map(|o| NextOffset::new(o.partition, o.offset)).collect(),
                gateway: p.gateway,
                policy: p.policy,
            }
        }
        pb::record::Kind::Lifecycle(l) => Op::Lifecycle {
            worker: l.worker,
            change: match l.change.ok_or(BadReason::UnknownKind)? {
                pb::worker_lifecycle::Change::Added(a) => {
                    Lifecycle::Added { metadata: a.metadata.into_iter().collect() }
                }
                pb::worker_lifecycle::Change::Removed(_) => Lifecycle::Removed,
                pb::worker_lifecycle::Change::Restarted(r) => Lifecycle::Restarted { new_epoch: r.new_epoch },
            },
        },
        pb::record::Kind::Tick(t) => Op::Tick { worker: t.worker },
    };
    if partition_of(op.worker(), partitions) != partition {
        return Err(BadReason::WrongPartition);
    }
    Ok(op)
}

/// The Kafka key of a worker's records.
pub fn worker_key(worker: u64) -> [u8; 8] {
    worker.to_be_bytes()
}

fn pb_keyspace(k: &KeyspaceId) -> pb::Keyspace {
    pb::Keyspace { model: k.model.clone(), block_size: k.block_size, hash_scheme: k.scheme }
}

fn wrap(kind: pb::record::Kind) -> Vec<u8> {
    pb::Record { version: RECORD_VERSION, kind: Some(kind) }.encode_to_vec()
}

/// Encodes a KV event batch (no lane metadata; see [`KvBatch`] for the full record).
pub fn encode_kv_events(
    keyspace: &KeyspaceId,
    worker: u64,
    dp_rank: u32,
    epoch: u64,
    seq: u64,
    gap_before: bool,
    events: &[KvOp],
) -> Vec<u8> {
    KvBatch { keyspace, worker, dp_rank, epoch, seq, gap_before, events, lanes: &[] }.encode()
}

/// One engine feed's KV event batch as a record: the feed header, the events, and the lane
/// metadata it announces (bridges; empty otherwise).
#[derive(Clone, Copy, Debug)]
pub struct KvBatch<'a> {
    pub keyspace: &'a KeyspaceId,
    pub worker: u64,
    pub dp_rank: u32,
    pub epoch: u64,
    pub seq: u64,
    pub gap_before: bool,
    pub events: &'a [KvOp],
    pub lanes: &'a [LaneMeta],
}

impl KvBatch<'_> {
    pub fn encode(&self) -> Vec<u8> {
        let KvBatch { keyspace, worker, dp_rank, epoch, seq, gap_before, events, lanes } = *self;
        let events = events
            .iter()
            .map(|e| match e {
                KvOp::Stored { tier, lane, parent_ext, blocks } => pb::KvEvent {
                    lane: *lane,
                    tier: tier.code() as i32,
                    event: Some(pb::kv_event::Event::Stored(pb::BlocksStored {
                        parent_ext: *parent_ext,
                        ext: blocks.iter().map(|b| b.ext).collect(),
                        local: blocks.iter().map(|b| b.local).collect(),
                    })),
                },
                KvOp::Removed { tier, lane, exts } => pb::KvEvent {
                    lane: *lane,
                    tier: tier.code() as i32,
                    event: Some(pb::kv_event::Event::Removed(pb::BlocksRemoved { ext: exts.clone() })),
                },
                KvOp::Cleared { lane } => pb::KvEvent {
                    lane: *lane,
                    tier: 0,
                    event: Some(pb::kv_event::Event::Cleared(pb::AllBlocksCleared {})),
                },
            })
            .collect();
        wrap(pb::record::Kind::KvEvents(pb::KvEventBatch {
            worker,
            dp_rank,
            keyspace: Some(pb_keyspace(keyspace)),
            epoch,
            seq,
            events,
            gap_before,
            lanes: lanes
                .iter()
                .map(|l| pb::LaneInfo {
                    lane: l.lane,
                    kind: l.kind.clone(),
                    sliding_window: l.sliding_window,
                    block_size: l.block_size,
                })
                .collect(),
        }))
    }
}

/// Encodes a placement (no policy name).
pub fn encode_placement(
    keyspace: &KeyspaceId,
    holder: HolderKey,
    locals: &[u64],
    answered_at: &[NextOffset],
    gateway: &str,
) -> Vec<u8> {
    encode_placement_with_policy(keyspace, holder, locals, answered_at, gateway, "")
}

/// Encodes a placement naming the routing policy that chose it (audits group by it).
pub fn encode_placement_with_policy(
    keyspace: &KeyspaceId,
    holder: HolderKey,
    locals: &[u64],
    answered_at: &[NextOffset],
    gateway: &str,
    policy: &str,
) -> Vec<u8> {
    wrap(pb::record::Kind::Placement(pb::Placement {
        worker: holder.worker,
        dp_rank: holder.dp_rank,
        lane: holder.lane,
        keyspace: Some(pb_keyspace(keyspace)),
        local: locals.to_vec(),
        answered_at: answered_at
            .iter()
            .map(|&NextOffset { partition, offset }| pb::PartitionOffset { partition, offset })
            .collect(),
        gateway: gateway.to_string(),
        policy: policy.to_string(),
    }))
}

/// Encodes a worker lifecycle change.
pub fn encode_lifecycle(worker: u64, change: &Lifecycle) -> Vec<u8> {
    use pb::worker_lifecycle::Change;
    let change = match change {
        Lifecycle::Added { metadata } => Change::Added(pb::WorkerAdded {
            metadata: metadata.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        }),
        Lifecycle::Removed => Change::Removed(pb::WorkerRemoved {}),
        Lifecycle::Restarted { new_epoch } => {
            Change::Restarted(pb::WorkerRestarted { new_epoch: *new_epoch })
        }
    };
    wrap(pb::record::Kind::Lifecycle(pb::WorkerLifecycle { worker, change: Some(change) }))
}

/// Encodes a tick for the partition of `worker`.
pub fn encode_tick(worker: u64) -> Vec<u8> {
    wrap(pb::record::Kind::Tick(pb::Tick { worker }))
}

/// Some worker id that maps to `partition`: ticks and other per-partition records need one.
pub fn worker_for_partition(partition: u32, partitions: u32) -> u64 {
    (0u64..).find(|&w| partition_of(w, partitions) == partition).expect("every partition has a worker")
}
