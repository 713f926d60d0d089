//! One LMCache instance's chunks as the bridge tracks them: which placements hold which kv
//! ranks of each chunk, the chunk's verified parent and its canonical hashes, and which
//! prefixlog tiers the bridge has credited it on (what the replicas hold for the instance).
//!
//! - **Verification.** A chunk is admitted only if LMCache's own hash of it can be recomputed:
//!   `chunk_hash = blake3(parent_hash ‖ token ids as u32 big-endian)`, with LMCache's
//!   `NONE_HASH = blake3(8 zero bytes ‖ u32 0)` before the first chunk (`TokenHasher` with its
//!   default `blake3` algorithm, LMCache 0.5.6 `lmcache/v1/multiprocess/token_hasher.py`,
//!   Apache-2.0). Store entries carry the chunk's tokens and offset but not its parent, so the
//!   parent is searched among the most recently stored or accessed chunks one chunk earlier
//!   (at most `parent_candidates`); a chunk whose hash no candidate reproduces is refused.
//!   So every credited chunk's tokens *and whole prefix* are proven, and its canonical local
//!   hash (scheme 1, the cache salt a key of the first chunk) is what a gateway computes from
//!   the prompt.
//! - **Ranks.** A chunk of a `world_size`-way model is usable only with every rank's slice:
//!   a placement credits its tier once all ranks are stored there, and a delete of any rank
//!   takes the credit back.
//! - **Parents.** A replica refuses a store whose parent its holder does not hold, so a chunk
//!   is credited only while its parent is credited on some tier (or it starts the prompt).
//! - **Bounds.** At most `max_chunks` chunks and [`MAX_NAMESPACES`] namespaces per instance;
//!   past them stores are refused (never an overcount: a refused store credits nothing).

use super::metrics::Refusal;
use super::wire::LmTier;
use prefixlog_engine::scheme::{keyed_block_hash, BlockKey};
use prefixlog_engine::{BlockHashes, Tier};
use prefixlog_state::record::KvOp;
use std::collections::{BTreeMap, VecDeque};

/// LMCache's chunk hash: a blake3 digest.
pub type Hash = [u8; 32];

/// Namespaces (model, salt, object group) one instance may use.
pub const MAX_NAMESPACES: usize = 4096;

/// Where the chunks of a namespace are indexed: model (the keyspace), cache salt (a key of the
/// first chunk's local hash) and object group (the lane).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Ns {
    pub model: String,
    pub salt: String,
    pub group: u32,
}

/// A placement's identity as LMCache keys it for a private backend: (tier, backend), and the
/// prefixlog tier it is credited on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Place {
    pub lm: LmTier,
    pub backend: u16,
    pub tier: Tier,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Key {
    ns: u32,
    hash: Hash,
}

struct Chunk {
    offset: u32,
    world: u32,
    local: u64,
    ext: u64,
    parent: Option<Hash>,
    /// Each placement and the ranks it holds (bit = global rank).
    places: Vec<(Place, u64)>,
    /// Tiers (bit = tier code) the replicas hold the chunk on.
    credited: u8,
}

/// A store entry, parsed.
pub struct Stored<'a> {
    pub ns: u32,
    pub hash: &'a [u8],
    pub world: u32,
    pub rank: u32,
    pub place: Place,
    pub tokens: &'a [i64],
    pub offset: i64,
}

/// Limits of one instance's table.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub chunk_size: u32,
    pub max_chunks: usize,
    pub parent_candidates: usize,
}

/// One instance's chunks. Ops it returns are tagged with their namespace index.
pub struct ChunkTable {
    limits: Limits,
    nss: Vec<Ns>,
    ns_index: BTreeMap<Ns, u32>,
    backends: Vec<String>,
    chunks: BTreeMap<Key, Chunk>,
    /// Per (namespace, offset), chunk hashes most recently stored or accessed first.
    recent: BTreeMap<(u32, u32), VecDeque<Hash>>,
}

/// `NONE_HASH` of LMCache's blake3 `TokenHasher`: `blake3(int 0 as 8 bytes ‖ u32 0)`.
fn none_hash() -> Hash {
    *blake3::hash(&[0u8; 12]).as_bytes()
}

fn lmcache_hash(parent: &Hash, tokens_be: &[u8]) -> Hash {
    let mut h = blake3::Hasher::new();
    h.update(parent);
    h.update(tokens_be);
    *h.finalize().as_bytes()
}

fn bit(t: Tier) -> u8 {
    1 << t.code()
}

fn full_mask(world: u32) -> u64 {
    if world >= 64 {
        u64::MAX
    } else {
        (1u64 << world) - 1
    }
}

impl ChunkTable {
    pub fn new(limits: Limits) -> Self {
        Self {
            limits,
            nss: Vec::new(),
            ns_index: BTreeMap::new(),
            backends: Vec::new(),
            chunks: BTreeMap::new(),
            recent: BTreeMap::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.chunks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }

    pub fn ns(&self, index: u32) -> &Ns {
        &self.nss[index as usize]
    }

    /// The index of a namespace, if the instance used it.
    pub fn ns_index(&self, ns: &Ns) -> Option<u32> {
        self.ns_index.get(ns).copied()
    }

    /// The index of a namespace (interned).
    pub fn intern(&mut self, ns: Ns) -> Result<u32, Refusal> {
        if let Some(&i) = self.ns_index.get(&ns) {
            return Ok(i);
        }
        if self.nss.len() >= MAX_NAMESPACES {
            return Err(Refusal::TooManyNamespaces);
        }
        let i = self.nss.len() as u32;
        self.nss.push(ns.clone());
        self.ns_index.insert(ns, i);
        Ok(i)
    }

    /// The index of a backend name (interned; few per instance).
    pub fn backend(&mut self, name: &str) -> Result<u16, Refusal> {
        if let Some(i) = self.backends.iter().position(|b| b == name) {
            return Ok(i as u16);
        }
        if self.backends.len() >= 256 {
            return Err(Refusal::Backend);
        }
        self.backends.push(name.to_string());
        Ok((self.backends.len() - 1) as u16)
    }

    /// A store of one rank of a chunk on a placement; credits newly complete tiers.
    pub fn store(&mut self, s: &Stored<'_>, out: &mut Vec<(u32, KvOp)>) -> Result<(), Refusal> {
        let hash: Hash = s.hash.try_into().map_err(|_| Refusal::HashLength)?;
        if s.world == 0 || s.world > 64 || s.rank >= s.world {
            return Err(Refusal::KvRank);
        }
        let key = Key { ns: s.ns, hash };
        match self.chunks.get(&key) {
            Some(c) if c.world != s.world => return Err(Refusal::KvRank),
            Some(_) => {}
            None => {
                let chunk = self.admit(s, &hash)?;
                self.chunks.insert(key, chunk);
            }
        }
        let c = self.chunks.get_mut(&key).expect("admitted");
        match c.places.iter_mut().find(|(p, _)| *p == s.place) {
            Some((_, mask)) => *mask |= 1 << s.rank,
            None => c.places.push((s.place, 1 << s.rank)),
        }
        let offset = c.offset;
        self.touch_recent(s.ns, offset, hash);
        self.recredit(key, out)
    }

    /// A new chunk: tokens, offset and hash checked, parent found, hashes computed.
    fn admit(&self, s: &Stored<'_>, hash: &Hash) -> Result<Chunk, Refusal> {
        let cs = self.limits.chunk_size;
        if s.tokens.is_empty() {
            return Err(Refusal::NoTokens);
        }
        if s.tokens.len() != cs as usize {
            return Err(Refusal::TokenCount);
        }
        let tokens: Vec<u32> = s
            .tokens
            .iter()
            .map(|&t| u32::try_from(t))
            .collect::<Result<_, _>>()
            .map_err(|_| Refusal::Tokens)?;
        if s.offset < 0 {
            return Err(Refusal::NoOffset);
        }
        let offset = u32::try_from(s.offset).map_err(|_| Refusal::Offset)?;
        if !offset.is_multiple_of(cs) {
            return Err(Refusal::Offset);
        }
        if self.chunks.len() >= self.limits.max_chunks {
            return Err(Refusal::TableFull);
        }
        let be: Vec<u8> = tokens.iter().flat_map(|t| t.to_be_bytes()).collect();
        let ns = &self.nss[s.ns as usize];
        let (parent, local) = if offset == 0 {
            if lmcache_hash(&none_hash(), &be) != *hash {
                return Err(Refusal::HashMismatch);
            }
            let salt = [BlockKey::Text(ns.salt.as_str())];
            let keys: &[BlockKey<'_>] = if ns.salt.is_empty() { &[] } else { &salt };
            (None, keyed_block_hash(0, &tokens, keys))
        } else {
            let p = self.find_parent(s.ns, offset - cs, &be, hash).ok_or(Refusal::UnknownParent)?;
            let parent_local = self.chunks[&Key { ns: s.ns, hash: p }].local;
            (Some(p), keyed_block_hash(parent_local, &tokens, &[]))
        };
        Ok(Chunk {
            offset,
            world: s.world,
            local,
            ext: ext_of(hash, &ns.salt),
            parent,
            places: Vec::new(),
            credited: 0,
        })
    }

    /// The chunk one position earlier whose hash, chained with `be`, is `hash`.
    fn find_parent(&self, ns: u32, offset: u32, be: &[u8], hash: &Hash) -> Option<Hash> {
        let cands = self.recent.get(&(ns, offset))?;
        cands
            .iter()
            .filter(|p| self.chunks.contains_key(&Key { ns, hash: **p }))
            .find(|p| lmcache_hash(p, be) == *hash)
            .copied()
    }

    fn touch_recent(&mut self, ns: u32, offset: u32, hash: Hash) {
        let list = self.recent.entry((ns, offset)).or_default();
        if let Some(i) = list.iter().position(|h| *h == hash) {
            list.remove(i);
        }
        list.push_front(hash);
        list.truncate(self.limits.parent_candidates.max(1));
    }

    /// An access: the chunk becomes the first parent candidate at its position.
    pub fn touch(&mut self, ns: u32, hash: &[u8]) {
        let Ok(hash) = Hash::try_from(hash) else { return };
        if let Some(offset) = self.chunks.get(&Key { ns, hash }).map(|c| c.offset) {
            self.touch_recent(ns, offset, hash);
        }
    }

    /// A delete of one rank of a chunk on a placement; `false` if the bridge never admitted
    /// the chunk (nothing of it is credited).
    pub fn delete(
        &mut self,
        ns: u32,
        hash: &[u8],
        rank: u32,
        place: Place,
        out: &mut Vec<(u32, KvOp)>,
    ) -> bool {
        let Ok(hash) = Hash::try_from(hash) else { return false };
        let key = Key { ns, hash };
        let Some(c) = self.chunks.get_mut(&key) else { return false };
        if let Some(i) = c.places.iter().position(|(p, _)| *p == place) {
            c.places[i].1 &= !(1u64.checked_shl(rank).unwrap_or(0));
            if c.places[i].1 == 0 {
                c.places.remove(i);
            }
        }
        // Only takes credits back: a delete completes nothing.
        let _ = self.recredit(key, out);
        if self.chunks[&key].places.is_empty() {
            self.chunks.remove(&key);
        }
        true
    }

    /// The tiers on which every rank of the chunk is held by one placement.
    fn complete(c: &Chunk) -> u8 {
        let full = full_mask(c.world);
        c.places.iter().filter(|(_, m)| *m == full).fold(0, |acc, (p, _)| acc | bit(p.tier))
    }

    fn credited(&self, ns: u32, hash: Option<Hash>) -> bool {
        hash.is_none_or(|h| self.chunks.get(&Key { ns, hash: h }).is_some_and(|c| c.credited != 0))
    }

    /// Brings the chunk's credits in line with its placements: removals for tiers no longer
    /// complete, stores for newly complete ones (if its parent is held).
    fn recredit(&mut self, key: Key, out: &mut Vec<(u32, KvOp)>) -> Result<(), Refusal> {
        let parent_held = self.credited(key.ns, self.chunks[&key].parent);
        let parent_ext = self.chunks[&key].parent.map(|p| ext_of(&p, &self.nss[key.ns as usize].salt));
        let lane = self.nss[key.ns as usize].group;
        let c = self.chunks.get_mut(&key).expect("a chunk");
        let complete = Self::complete(c);
        for tier in Tier::ALL.into_iter().filter(|&t| c.credited & !complete & bit(t) != 0) {
            out.push((key.ns, KvOp::Removed { tier, lane, exts: vec![c.ext] }));
        }
        c.credited &= complete;
        let newly = complete & !c.credited;
        if newly == 0 {
            return Ok(());
        }
        if !parent_held {
            return Err(Refusal::ParentNotHeld);
        }
        for tier in Tier::ALL.into_iter().filter(|&t| newly & bit(t) != 0) {
            out.push((
                key.ns,
                KvOp::Stored { tier, lane, parent_ext, blocks: vec![BlockHashes::new(c.ext, c.local)] },
            ));
        }
        c.credited |= newly;
        Ok(())
    }

    /// Forgets everything (a gap: what the instance holds is unknown).
    pub fn clear(&mut self) {
        self.chunks.clear();
        self.recent.clear();
    }

    /// A restart (new incarnation): L1 placements are void. The replicas clear the instance
    /// on the new epoch, so every chunk still held (on L2) is stored again, parents first, up
    /// to `budget` chunks; the rest lose their credit. Returns (carried, dropped).
    pub fn fence_l1(&mut self, budget: usize, out: &mut Vec<(u32, KvOp)>) -> (u64, u64) {
        self.chunks.retain(|_, c| {
            c.places.retain(|(p, _)| p.lm != LmTier::L1);
            c.credited = 0;
            !c.places.is_empty()
        });
        let mut order: Vec<(u32, Key)> = self.chunks.iter().map(|(k, c)| (c.offset, *k)).collect();
        order.sort_unstable();
        let (mut carried, mut dropped) = (0u64, 0u64);
        for (_, key) in order {
            if Self::complete(&self.chunks[&key]) == 0 {
                continue;
            }
            if carried as usize >= budget {
                dropped += 1;
                continue;
            }
            let mut ops = Vec::new();
            match self.recredit(key, &mut ops) {
                Ok(()) => carried += 1,
                Err(_) => dropped += 1,
            }
            out.extend(ops);
        }
        (carried, dropped)
    }
}

/// The ext hash of a chunk (what stores chain on and removals name): its LMCache hash and
/// salt, so two salts' chunks of the same tokens stay apart.
pub fn ext_of(hash: &Hash, salt: &str) -> u64 {
    let mut bytes = hash.to_vec();
    bytes.extend_from_slice(salt.as_bytes());
    xxhash_rust::xxh3::xxh3_64(&bytes)
}

/// LMCache's chunk hashes of a prompt (`TokenHasher.compute_chunk_hashes`, blake3): tests
/// and tools build LMCache-shaped events with it.
pub fn lmcache_chunk_hashes(tokens: &[u32], chunk_size: usize) -> Vec<Hash> {
    let mut prev = none_hash();
    tokens
        .chunks_exact(chunk_size.max(1))
        .map(|c| {
            let be: Vec<u8> = c.iter().flat_map(|t| t.to_be_bytes()).collect();
            prev = lmcache_hash(&prev, &be);
            prev
        })
        .collect()
}
