//! One `Update`: validation (a refused update ends the `Publish` stream with its status) and
//! the records its events become (pure).
//!
//! | update | becomes |
//! |---|---|
//! | `seq > 0`: `stored` | `BlocksStored{lane 0, parent_ext = parent_seq_hash, ext = seq_hash, local = content_hash}` |
//! | `seq > 0`: `removed` | `BlocksRemoved{lane 0, ext = seq_hashes}` |
//! | `seq > 0`: `cleared` | `AllBlocksCleared{lane 0}` |
//! | `seq = 0`: `stored` without parent | a `Placement` of the content hashes (a chain from position 0) |
//! | `seq = 0`: `stored` with a parent | skipped, reason `placement_with_parent` (a placement is a chain from the root; SMG's gateway never sends it) |
//! | `seq = 0`: `removed`, `cleared` | skipped, reason `unsequenced_removal` (prefixlog removes inferred blocks by TTL and capacity only) |
//! | `stored_digest` | nothing; the ack carries `digest_miss_tip` (reason `digest_unconfirmed`) |
//!
//! An unconfirmed digest makes the publisher resend the full chain: prefixlog keeps no
//! placement seq hashes, so it cannot confirm a tip, and a miss is what upstream answers
//! whenever it is unsure. Skipping never overcounts: a block not stored is only under-matched.

use super::keyspace::{self, KeyspaceError};
use super::pb::{event::Kind, Update};
use super::{LANE, MAX_EVENTS, MAX_HOLDER_BYTES, MAX_UPDATE_BLOCKS};
use prefixlog_engine::KeyspaceId;
use prefixlog_state::BlockHashes;
use prefixlog_state::{KvOp, Tier};

/// Why an update is refused (nothing of it is applied; the stream ends).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum UpdateError {
    #[error("holder must not be empty")]
    NoHolder,
    #[error("holder has {0} bytes; at most {MAX_HOLDER_BYTES}")]
    HolderTooLong(usize),
    #[error(transparent)]
    BadName(#[from] crate::writers::BadName),
    #[error(transparent)]
    Keyspace(#[from] KeyspaceError),
    #[error("{0} events in one update; at most {MAX_EVENTS}")]
    TooManyEvents(usize),
    #[error("{0} blocks in one update; at most {MAX_UPDATE_BLOCKS}")]
    TooManyBlocks(usize),
}

impl UpdateError {
    pub fn status(&self) -> tonic::Status {
        match self {
            Self::Keyspace(e) => e.status(),
            Self::TooManyEvents(_) | Self::TooManyBlocks(_) => {
                tonic::Status::resource_exhausted(self.to_string())
            }
            _ => tonic::Status::invalid_argument(self.to_string()),
        }
    }
}

/// Events not applied, by reason (the `reason` label of the skipped counter).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Skipped {
    pub placement_with_parent: u64,
    pub unsequenced_removal: u64,
    pub digest_unconfirmed: u64,
    /// An event kind this build does not know (a newer publisher).
    pub unknown_event: u64,
}

impl Skipped {
    pub fn reasons(&self) -> [(&'static str, u64); 4] {
        [
            ("placement_with_parent", self.placement_with_parent),
            ("unsequenced_removal", self.unsequenced_removal),
            ("digest_unconfirmed", self.digest_unconfirmed),
            ("unknown_event", self.unknown_event),
        ]
    }
}

/// What an update's events become.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Mapped {
    /// `seq > 0`: the ops of one `KvEventBatch`.
    pub ops: Vec<KvOp>,
    /// `seq = 0`: one placement (content hashes from position 0) per `stored`.
    pub placements: Vec<Vec<u64>>,
    /// The first `stored_digest`'s tip: answered as a miss.
    pub digest_miss: Option<u64>,
    pub skipped: Skipped,
}

impl Mapped {
    /// Whether the update carries events at all (lifecycle-only updates do not touch epochs).
    pub fn has_events(&self) -> bool {
        !self.ops.is_empty() || !self.placements.is_empty()
    }
}

/// Checks an update before anything of it is published; its prefixlog keyspace.
pub fn validate(u: &Update) -> Result<KeyspaceId, UpdateError> {
    match u.holder.len() {
        0 => return Err(UpdateError::NoHolder),
        n if n > MAX_HOLDER_BYTES => return Err(UpdateError::HolderTooLong(n)),
        _ => {}
    }
    crate::writers::check_name(&u.holder)?;
    let ks = keyspace::map(u.keyspace.as_ref())?;
    if u.events.len() > MAX_EVENTS {
        return Err(UpdateError::TooManyEvents(u.events.len()));
    }
    let blocks: usize = u
        .events
        .iter()
        .map(|e| match &e.kind {
            Some(Kind::Stored(s)) => s.blocks.len(),
            Some(Kind::Removed(r)) => r.seq_hashes.len(),
            _ => 0,
        })
        .sum();
    if blocks > MAX_UPDATE_BLOCKS {
        return Err(UpdateError::TooManyBlocks(blocks));
    }
    Ok(ks)
}

/// The records of a validated update's events.
pub fn map_events(u: &Update) -> Mapped {
    let mut m = Mapped::default();
    let sequenced = u.seq > 0;
    for e in &u.events {
        match &e.kind {
            Some(Kind::StoredDigest(d)) => {
                m.digest_miss.get_or_insert(d.tip_seq_hash);
                m.skipped.digest_unconfirmed += 1;
            }
            Some(Kind::Stored(s)) if sequenced => m.ops.push(KvOp::Stored {
                tier: Tier::Gpu,
                lane: LANE,
                parent_ext: s.parent_seq_hash,
                blocks: s.blocks.iter().map(|b| BlockHashes::new(b.seq_hash, b.content_hash)).collect(),
            }),
            Some(Kind::Removed(r)) if sequenced => {
                m.ops.push(KvOp::Removed { tier: Tier::Gpu, lane: LANE, exts: r.seq_hashes.clone() })
            }
            Some(Kind::Cleared(true)) if sequenced => m.ops.push(KvOp::Cleared { lane: LANE }),
            Some(Kind::Cleared(false)) => {}
            Some(Kind::Stored(s)) if s.parent_seq_hash.is_some() => m.skipped.placement_with_parent += 1,
            Some(Kind::Stored(s)) if s.blocks.is_empty() => {}
            Some(Kind::Stored(s)) => m.placements.push(s.blocks.iter().map(|b| b.content_hash).collect()),
            Some(Kind::Removed(_) | Kind::Cleared(true)) => m.skipped.unsequenced_removal += 1,
            None => m.skipped.unknown_event += 1,
        }
    }
    m
}

#[cfg(test)]
mod tests {
    use super::super::pb::{self, Block, Event, Removed, Stored, StoredDigest};
    use super::*;
    use prefixlog_state::BlockHashes;

    fn stored(parent: Option<u64>, blocks: &[(u64, u64)]) -> Event {
        let blocks =
            blocks.iter().map(|&(seq_hash, content_hash)| Block { seq_hash, content_hash }).collect();
        Event { kind: Some(Kind::Stored(Stored { parent_seq_hash: parent, blocks })) }
    }

    fn update(seq: u64, events: Vec<Event>) -> Update {
        let keyspace = pb::Keyspace {
            model: "m".into(),
            symbol_kind: pb::SymbolKind::Tokens as i32,
            block_size: 4,
            hash_scheme: 1,
        };
        Update { keyspace: Some(keyspace), holder: "w".into(), epoch: 1, seq, events, ..Default::default() }
    }

    fn digest(tip: u64) -> Event {
        Event {
            kind: Some(Kind::StoredDigest(StoredDigest { parent_seq_hash: None, tip_seq_hash: tip, len: 2 })),
        }
    }

    #[test]
    fn sequenced_events_are_one_batch_in_order() {
        let removed = Event { kind: Some(Kind::Removed(Removed { seq_hashes: vec![7] })) };
        let u = update(
            3,
            vec![stored(None, &[(1, 11), (2, 12)]), removed, stored(Some(2), &[(3, 13)]), digest(9)],
        );
        let m = map_events(&u);
        assert_eq!(
            m.ops,
            vec![
                KvOp::Stored {
                    tier: Tier::Gpu,
                    lane: 0,
                    parent_ext: None,
                    blocks: [(1, 11), (2, 12)].map(BlockHashes::from).to_vec()
                },
                KvOp::Removed { tier: Tier::Gpu, lane: 0, exts: vec![7] },
                KvOp::Stored {
                    tier: Tier::Gpu,
                    lane: 0,
                    parent_ext: Some(2),
                    blocks: [(3, 13)].map(BlockHashes::from).to_vec()
                },
            ]
        );
        assert!(m.placements.is_empty());
        assert_eq!((m.digest_miss, m.skipped.digest_unconfirmed), (Some(9), 1), "mixed: a miss, as upstream");
    }

    #[test]
    fn unsequenced_stores_are_placements_and_the_rest_is_counted() {
        let u = update(
            0,
            vec![
                stored(None, &[(1, 11), (2, 12)]),
                stored(Some(2), &[(3, 13)]),
                Event { kind: Some(Kind::Cleared(true)) },
                Event { kind: Some(Kind::Removed(Removed { seq_hashes: vec![1] })) },
                digest(5),
                digest(6),
                Event { kind: None },
            ],
        );
        let m = map_events(&u);
        assert_eq!(m.placements, vec![vec![11, 12]]);
        assert!(m.ops.is_empty());
        assert_eq!(m.digest_miss, Some(5), "the first tip");
        let s = Skipped {
            placement_with_parent: 1,
            unsequenced_removal: 2,
            digest_unconfirmed: 2,
            unknown_event: 1,
        };
        assert_eq!(m.skipped, s);
        assert!(!map_events(&update(0, vec![digest(1)])).has_events());
    }

    #[test]
    fn refusals() {
        let mut u = update(1, vec![]);
        assert!(validate(&u).is_ok());
        u.holder.clear();
        assert_eq!(validate(&u), Err(UpdateError::NoHolder));
        u.holder = "h".repeat(MAX_HOLDER_BYTES + 1);
        assert_eq!(validate(&u).unwrap_err().status().code(), tonic::Code::InvalidArgument);
        u.holder = "h\u{202e}".into();
        assert!(matches!(validate(&u), Err(UpdateError::BadName(_))));
        u.holder = "h".into();
        u.events = vec![stored(None, &vec![(1, 1); MAX_UPDATE_BLOCKS + 1])];
        assert_eq!(validate(&u).unwrap_err().status().code(), tonic::Code::ResourceExhausted);
        u.events.clear();
        u.keyspace.as_mut().unwrap().hash_scheme = 7;
        assert_eq!(validate(&u).unwrap_err().status().code(), tonic::Code::FailedPrecondition);
    }
}
