//! The RocksDB handle behind a [`crate::CheckpointStore`], and what a replica's store does when
//! its disk fails it: a replica must never crash-loop on its checkpoints, which are only a
//! shortcut (the log, or a peer, holds the same state).
//!
//! - **Full disk at start**: the store opens read-only (RocksDB needs room for a new MANIFEST
//!   and WAL to open read-write), so the newest checkpoint still restores; writes wait for space.
//! - **Full disk at run time**: a failed flush or write leaves RocksDB refusing every later
//!   write — the deletes retention would free space with included — until it is reopened
//!   (measured on a full tmpfs: writes, deletes and small puts all fail with the flush's
//!   error; after a reopen they succeed). So a failed write marks the handle for a reopen,
//!   and the next write reopens it first: checkpoints resume once space returns.
//! - **Damage** (a flipped byte in an SST footer, the MANIFEST or CURRENT: RocksDB refuses to
//!   open, read-only too): the directory is moved aside, kept for forensics, and a fresh store
//!   takes its place; the replica then starts from a peer or the log. Damage inside an SST's
//!   data is found by reads instead: that checkpoint fails verification and an older one is used.
//! - **A lock held by another process, or a permission error**: not damage. Refused with the
//!   error; moving aside a directory another replica is using would be far worse than not
//!   starting.

use rocksdb::{Options, DB};
use std::path::{Path, PathBuf};

/// What kind of failure a RocksDB error is, for the decisions above.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    /// The disk is full.
    NoSpace,
    /// The store's files are damaged (RocksDB's `Corruption`, or a file its metadata names is
    /// missing or unreadable).
    Damaged,
    /// Another process holds the store, or the process may not use it: an operator's problem,
    /// never a reason to move data.
    Refused,
}

pub fn classify(e: &rocksdb::Error) -> Failure {
    classify_message(e.as_ref())
}

fn classify_message(m: &str) -> Failure {
    if m.contains("No space left on device") || m.contains("ENOSPC") {
        Failure::NoSpace
    } else if m.contains("Permission denied") || m.to_ascii_lowercase().contains("lock") {
        Failure::Refused
    } else {
        Failure::Damaged
    }
}

/// How a replica's store was opened ([`crate::CheckpointStore::open_for_replica`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Opened {
    Normally,
    /// The disk is full: opened read-only, so checkpoints restore; writes reopen it first.
    ReadOnly {
        why: String,
    },
    /// Not even a read-only open worked (a full disk): no checkpoints to restore; writes try
    /// to open it again.
    Unavailable {
        why: String,
    },
    /// The directory was damaged: moved to `moved_to` (kept for forensics), and a fresh store
    /// created in its place.
    Quarantined {
        moved_to: PathBuf,
        why: String,
    },
}

/// What the handle allows now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    ReadWrite,
    /// Read-only or unusable until a reopen succeeds (a failed write, a full disk at start).
    Reopen {
        why: String,
    },
    /// A reader beside a live primary: never written, never reopened.
    Secondary,
}

pub(crate) struct Handle {
    pub db: Option<DB>,
    pub mode: Mode,
}

/// The options every read-write open uses.
pub(crate) fn options() -> Options {
    let mut o = Options::default();
    o.create_if_missing(true);
    // No compression: an engine image is mostly hashes (LZ4 kept 80% of it) and
    // decompressing it was an eighth of a restore (`perf` on `bench-restart`: read + verify
    // 0.41 → 0.31 s at 16.7M holder-blocks). Tables LZ4 wrote before stay readable (RocksDB
    // records the compression per block).
    o.set_compression_type(rocksdb::DBCompressionType::None);
    // Checkpoint values are large and written once: keep write amplification low.
    o.set_target_file_size_base(64 << 20);
    // Each open starts a new info log: reopens after failed writes must not pile them up.
    o.set_keep_log_file_num(8);
    // No preallocation of WAL and MANIFEST files (tens of MiB): on a nearly full disk it only
    // makes writes fail sooner, and hands the space back unpredictably when the files go.
    // (The crate has no setter for it; the options string is RocksDB's own way.)
    o.get_options_from_string("allow_fallocate=false").expect("allow_fallocate is a RocksDB option")
}

/// A read-write open, or, when the disk is full, the best that can be had: read-only, or none.
pub(crate) fn open_or_read_only(path: &Path) -> Result<Handle, (rocksdb::Error, Failure)> {
    let e = match DB::open(&options(), path) {
        Ok(db) => return Ok(Handle { db: Some(db), mode: Mode::ReadWrite }),
        Err(e) => e,
    };
    let failure = classify(&e);
    if failure != Failure::NoSpace {
        return Err((e, failure));
    }
    let why = e.to_string();
    let db = DB::open_for_read_only(&options(), path, false).ok();
    Ok(Handle { db, mode: Mode::Reopen { why } })
}

/// Moves a damaged store directory aside (same parent, `NAME.damaged-UNIXSECONDS[-N]`).
pub(crate) fn move_aside(path: &Path) -> std::io::Result<PathBuf> {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let name = path.file_name().map_or_else(|| "checkpoints".into(), |n| n.to_string_lossy().into_owned());
    for n in 0u32.. {
        let suffix = if n == 0 { String::new() } else { format!("-{n}") };
        let to = path.with_file_name(format!("{name}.damaged-{secs}{suffix}"));
        if !to.exists() {
            std::fs::rename(path, &to)?;
            return Ok(to);
        }
    }
    unreachable!("some suffix is free")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_options_string_keeps_the_other_options() {
        let dir = tempfile::tempdir().unwrap();
        drop(DB::open(&options(), dir.path()).unwrap());
        let file = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| p.file_name().unwrap().to_string_lossy().starts_with("OPTIONS-"))
            .unwrap();
        let text = std::fs::read_to_string(file).unwrap();
        for want in ["allow_fallocate=false", "compression=kNoCompression", "target_file_size_base=67108864"]
        {
            assert!(text.contains(want), "{want} missing from the store's OPTIONS file");
        }
    }

    #[test]
    fn failures_are_told_apart_by_message() {
        let kinds = [
            ("IO error: No space left on device: While appending to file: x/000013.sst", Failure::NoSpace),
            ("Corruption: CURRENT file corrupted", Failure::Damaged),
            ("Corruption: checksum mismatch  The file x/MANIFEST-000005 may be corrupted.", Failure::Damaged),
            ("IO error: No such file or directory: While opening a file for sequentially reading: x/MANIFEST-000009", Failure::Damaged),
            ("IO error: While lock file: x/LOCK: Resource temporarily unavailable", Failure::Refused),
            ("IO error: lock hold by current process, acquire time 1 acquiring thread 2: x/LOCK: No locks available", Failure::Refused),
            ("IO error: While open a file for appending: x/000001.log: Permission denied", Failure::Refused),
        ];
        for (m, want) in kinds {
            assert_eq!(classify_message(m), want, "{m}");
        }
    }
}
