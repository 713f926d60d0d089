//! Flood records (issue 34): small, well-formed records that each name something new, one
//! kind per flood. Used by the end-to-end flood test (`prefixlog/tests/flood.rs`, a `serve`
//! child process fed by a plain rdkafka producer) and the in-process cost measurement
//! (`tests/tests/flood_cost.rs`, heap bytes per record).

use prefixlog_engine::{HolderKey, KeyspaceId};
use prefixlog_state::record::{encode_kv_events, encode_lifecycle, encode_placement, encode_tick};
use prefixlog_state::BlockHashes;
use prefixlog_state::{KvOp, Lifecycle, StateSettings, Tier};

/// What each record of a flood names anew. All records go to one partition's workers when
/// the log has one partition (the floods use one: every per-partition limit is reached).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FloodKind {
    /// A new model name per record (one worker, so a new feed too); an `AllBlocksCleared`
    /// (issue 34's 32-byte record) and a one-block store in turn.
    Keyspace,
    /// A placement for a new worker per record (a new inferred holder, one block).
    Holder,
    /// A one-block store in a new lane of one feed per record.
    Lane,
    /// A `WorkerAdded` for a new worker per record, with a pod name.
    Worker,
    /// Ticks, which create nothing: what reading that many records costs by itself.
    Control,
}

impl FloodKind {
    pub const ALL: [FloodKind; 5] =
        [FloodKind::Control, FloodKind::Keyspace, FloodKind::Holder, FloodKind::Lane, FloodKind::Worker];

    /// Record `i` of the flood: (worker, value).
    pub fn record(self, i: u64) -> (u64, Vec<u8>) {
        let ks = KeyspaceId::new("m", 16, 1);
        let store = |lane: u32| KvOp::Stored {
            tier: Tier::Gpu,
            lane,
            parent_ext: None,
            blocks: [(i + 1, i)].map(BlockHashes::from).to_vec(),
        };
        match self {
            FloodKind::Keyspace => {
                let op = if i.is_multiple_of(2) { KvOp::Cleared { lane: 0 } } else { store(0) };
                (7, encode_kv_events(&KeyspaceId::new(format!("m{i}"), 16, 1), 7, 0, 1, i + 1, false, &[op]))
            }
            FloodKind::Holder => {
                (1_000 + i, encode_placement(&ks, HolderKey::new(1_000 + i, 0, 0), &[i], &[], "g"))
            }
            FloodKind::Lane => (7, encode_kv_events(&ks, 7, 0, 1, i + 1, false, &[store(i as u32)])),
            FloodKind::Worker => {
                let metadata = [("pod".to_string(), format!("pod-{i}"))].into_iter().collect();
                (1_000 + i, encode_lifecycle(1_000 + i, &Lifecycle::Added { metadata }))
            }
            FloodKind::Control => (7, encode_tick(7)),
        }
    }

    /// How many of `n` records of one partition the limits of `s` accept.
    pub fn accepted(self, n: u64, s: &StateSettings) -> u64 {
        let limit = match self {
            FloodKind::Keyspace => s.max_keyspaces_per_partition,
            FloodKind::Holder => s.max_holders_per_partition,
            FloodKind::Lane => s.max_lanes_per_feed,
            FloodKind::Worker => s.max_workers_per_partition,
            FloodKind::Control => u32::MAX,
        };
        n.min(u64::from(limit))
    }

    /// The reason the limits refuse the excess for (`None` for the control).
    pub fn reason(self) -> Option<&'static str> {
        match self {
            FloodKind::Keyspace => Some("too_many_keyspaces"),
            FloodKind::Holder => Some("too_many_holders"),
            FloodKind::Lane => Some("too_many_lanes"),
            FloodKind::Worker => Some("too_many_workers"),
            FloodKind::Control => None,
        }
    }
}
