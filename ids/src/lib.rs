//! Identifiers every layer shares, with no dependency at all (serde derives only behind the
//! `serde` feature, which checkpoints use): the keyspace a block belongs to,
//! and where a published record landed (the consistency token). Their own crate so the gateway
//! client (`prefixlog-client`) names them without linking the engine or librdkafka, and the
//! engine stays free of the gRPC stack; the engine and ingest re-export them.
//!
//! Module map (one file): [`KeyspaceId`]; [`Landed`], [`NextOffset`] and [`token_of`];
//! [`BlockHashes`], a stored block's two hashes; [`Tier`], the storage tier a block is held on.
//! The pairs are named types, not tuples, so a swapped pair does not compile.

use std::collections::BTreeMap;
use std::fmt;

/// A keyspace: blocks only match within one model, block size and hash scheme.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct KeyspaceId {
    pub model: String,
    pub block_size: u32,
    pub scheme: u32,
}

impl KeyspaceId {
    pub fn new(model: impl Into<String>, block_size: u32, scheme: u32) -> Self {
        Self { model: model.into(), block_size, scheme }
    }
}

impl fmt::Display for KeyspaceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/bs{}/scheme{}", self.model, self.block_size, self.scheme)
    }
}

/// Where a record landed (its partition and record offset).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Landed {
    pub partition: u32,
    /// The record's own offset.
    pub offset: i64,
}

impl Landed {
    /// The consistency token that covers this record: `(partition, offset + 1)`, a next offset,
    /// the unit of every offset in the query API.
    pub fn token(&self) -> NextOffset {
        NextOffset { partition: self.partition, offset: self.offset + 1 }
    }
}

/// One entry of a consistency token or a read position: a partition and the next offset on
/// it (every record below `offset` is covered; the first record to read is at `offset`).
/// Tokens are lists of these, one per partition, sorted by partition.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NextOffset {
    pub partition: u32,
    /// The next offset: one past the last covered record.
    pub offset: i64,
}

impl NextOffset {
    pub const fn new(partition: u32, offset: i64) -> Self {
        Self { partition, offset }
    }
}

impl From<(u32, i64)> for NextOffset {
    /// `(partition, next offset)`, the order of the log's `PartitionOffset`.
    fn from((partition, offset): (u32, i64)) -> Self {
        Self { partition, offset }
    }
}

/// As `[partition, offset]`, what reports printed before the type had a name.
#[cfg(feature = "serde")]
impl serde::Serialize for NextOffset {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        (self.partition, self.offset).serialize(s)
    }
}

/// The smallest token covering every landed record: per partition, the highest offset + 1.
pub fn token_of(landed: &[Landed]) -> Vec<NextOffset> {
    let mut m = BTreeMap::new();
    for l in landed {
        let t = l.token();
        let e = m.entry(t.partition).or_insert(t.offset);
        *e = (*e).max(t.offset);
    }
    m.into_iter().map(|(partition, offset)| NextOffset { partition, offset }).collect()
}

/// A stored block's two hashes, as engines report them: `ext`, the engine's own block hash
/// (chained over the prefix; what the log's stores, removals and parents name), and `local`,
/// the hash of the block's tokens under the keyspace's scheme (what queries match on).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockHashes {
    pub ext: u64,
    pub local: u64,
}

impl BlockHashes {
    pub const fn new(ext: u64, local: u64) -> Self {
        Self { ext, local }
    }
}

impl From<(u64, u64)> for BlockHashes {
    /// `(ext, local)`, the order of the log's and engines' wire formats.
    fn from((ext, local): (u64, u64)) -> Self {
        Self { ext, local }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_of_keeps_the_highest_next_offset_per_partition() {
        let l = |partition, offset| Landed { partition, offset };
        let n = NextOffset::new;
        assert_eq!(token_of(&[l(1, 5), l(0, 2), l(1, 3)]), vec![n(0, 3), n(1, 6)]);
        assert_eq!(token_of(&[]), vec![]);
    }
}

/// Where an engine keeps a block: the storage tiers engines offload KV blocks to. An open,
/// documented enumeration on the wire (`StorageTier` in the protos: 0 gpu, 1 host, 2 disk,
/// 3 external); a code outside it is refused, never guessed. A worker's holdings on different
/// tiers are independent: removing a block from the GPU leaves its host copy credited.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum Tier {
    /// The accelerator's own KV cache (vLLM `GPU`). What engines report without a medium.
    #[default]
    Gpu = 0,
    /// Host (CPU) memory (vLLM `CPU`, SGLang's host cache, LMCache's local CPU backend).
    Host = 1,
    /// Local disk (LMCache / vLLM disk offload, SGLang's storage backends on local disk).
    Disk = 2,
    /// A pool outside the worker (Mooncake store, LMCache remote, a shared file system).
    External = 3,
}

impl Tier {
    /// Every tier, in the default preference order (cheapest hit first).
    pub const ALL: [Tier; 4] = [Tier::Gpu, Tier::Host, Tier::Disk, Tier::External];

    /// The wire code (the `StorageTier` enum value).
    pub const fn code(self) -> u32 {
        self as u32
    }

    /// The tier of a wire code; `None` for a code outside the enumeration.
    pub const fn from_code(code: u32) -> Option<Tier> {
        match code {
            0 => Some(Tier::Gpu),
            1 => Some(Tier::Host),
            2 => Some(Tier::Disk),
            3 => Some(Tier::External),
            _ => None,
        }
    }

    /// The tier's name in docs, metrics and flags: `gpu`, `host`, `disk`, `external`.
    pub const fn name(self) -> &'static str {
        match self {
            Tier::Gpu => "gpu",
            Tier::Host => "host",
            Tier::Disk => "disk",
            Tier::External => "external",
        }
    }

    /// The tier named `name` (as [`Tier::name`] spells it, any case).
    pub fn from_name(name: &str) -> Option<Tier> {
        Tier::ALL.into_iter().find(|t| t.name().eq_ignore_ascii_case(name))
    }
}

impl fmt::Display for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
