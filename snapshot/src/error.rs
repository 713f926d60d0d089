//! What can go wrong with a checkpoint, precisely: which value is damaged and how.

use crate::decode_error::DecodeError;
use crate::format::READABLE_FORMATS;
use prefixlog_engine::KeyspaceId;
use std::path::PathBuf;
use xxhash_rust::xxh3::xxh3_64;

/// Which value of a checkpoint is damaged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Part {
    Meta,
    PartitionState,
    Keyspace(KeyspaceId),
    /// A transferred checkpoint (bootstrap, recovery) as a whole.
    Export,
}

impl std::fmt::Display for Part {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Part::Meta => f.write_str("meta"),
            Part::PartitionState => f.write_str("partition state"),
            Part::Keyspace(k) => write!(f, "keyspace {k}"),
            Part::Export => f.write_str("export"),
        }
    }
}

/// What is wrong with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Damage {
    /// Its checksum does not match.
    Checksum,
    /// Shorter or longer than the meta says.
    Length { expected: u64, found: u64 },
    /// A value (or chunk `n`) the meta names is not in the store.
    Missing { chunk: Option<u32> },
    /// Not a prefixlog checkpoint export.
    NotAnExport,
    /// The meta names another checkpoint id.
    WrongId(u64),
    /// The partition state lists another number of partitions than the meta.
    PartitionCount { meta: usize, state: usize },
}

impl std::fmt::Display for Damage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Damage::Checksum => f.write_str("checksum mismatch"),
            Damage::Length { expected, found } => write!(f, "{found} bytes, the meta says {expected}"),
            Damage::Missing { chunk: Some(c) } => write!(f, "chunk {c} missing"),
            Damage::Missing { chunk: None } => f.write_str("missing"),
            Damage::NotAnExport => f.write_str("not a prefixlog checkpoint export"),
            Damage::WrongId(id) => write!(f, "meta names checkpoint {id}"),
            Damage::PartitionCount { meta, state } => {
                write!(f, "{state} partitions in the state, {meta} in the meta")
            }
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("rocksdb: {0}")]
    Db(#[from] rocksdb::Error),
    #[error(transparent)]
    Decode(#[from] DecodeError),
    #[error("checkpoint {0} does not exist")]
    NoSuchCheckpoint(u64),
    #[error("checkpoint {id}: {part}: {damage}")]
    Damaged { id: u64, part: Part, damage: Damage },
    #[error("checkpoint {id}: format version {found}, this build reads {READABLE_FORMATS:?} (take a new checkpoint or replay the log)")]
    Format { id: u64, found: u32 },
    #[error("checkpoint {id}: {what}")]
    Settings { id: u64, what: prefixlog_state::settings::SettingsError },
    #[error("opening a reader beside the store at {path}: {source}")]
    Reader { path: PathBuf, source: rocksdb::Error },
    /// Nothing is written of a state that holds part of a record whose apply failed.
    #[error("checkpoint withheld: {0} (the state may hold part of that record)")]
    Withheld(prefixlog_state::ApplyFailure),
    #[error("the checkpoint store at {path} is not writable now ({why}); retried on the next write")]
    Unavailable { path: PathBuf, why: String },
    #[error("the checkpoint store at {path} is damaged ({why}) and could not be moved aside: {source}")]
    MoveAside { path: PathBuf, why: String, source: std::io::Error },
}

impl StoreError {
    /// Whether this is the disk being full (counted apart: it resolves itself once space
    /// returns, and says nothing about the data).
    pub fn is_no_space(&self) -> bool {
        match self {
            StoreError::Db(e) => crate::handle::classify(e) == crate::handle::Failure::NoSpace,
            StoreError::Unavailable { why, .. } => why.contains("No space left on device"),
            _ => false,
        }
    }
}

pub(crate) fn damaged(id: u64, part: Part, damage: Damage) -> StoreError {
    StoreError::Damaged { id, part, damage }
}

/// Checks a value's length and checksum against what the meta says.
pub(crate) fn verify(id: u64, part: Part, bytes: &[u8], len: u64, checksum: u64) -> Result<(), StoreError> {
    if bytes.len() as u64 != len {
        return Err(damaged(id, part, Damage::Length { expected: len, found: bytes.len() as u64 }));
    }
    if xxh3_64(bytes) != checksum {
        return Err(damaged(id, part, Damage::Checksum));
    }
    Ok(())
}
