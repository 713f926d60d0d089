//! One engine stream's state: sequence tracking (in order, duplicate, gap, restart), epochs,
//! and the translation of decoded events into log operations. Pure (no I/O), so the policy is
//! unit-tested without sockets; `super::EngineBridge` does the I/O around it.
//!
//! Sequence policy (vLLM numbers batches 0, 1, 2, … per publisher process):
//! - `seq == last + 1`: in order.
//! - `seq > last + 1`: a gap from `last + 1`; the first message a session sees is treated as
//!   following `-1`, so a bridge that joins a running engine (first seq > 0) reports a gap from
//!   0 (the engine holds blocks the bridge never saw) unless replay recovers them.
//! - `seq <= last` with the same payload digest as the message of that seq already handled:
//!   a duplicate (ZeroMQ delivery is at-least-once, replays overlap the live stream).
//! - `seq <= last` otherwise: the engine restarted (its counter went back, usually to 0): a new
//!   epoch, which makes every replica clear the holder's old blocks.
//! - (With a replay socket, `super::EngineBridge` also catches a restarted engine that is already
//!   past `last`: it requests the replay from `last` and compares that message's digest.)
//!
//! Hashing: each stored block's *local* hash is the keyspace's scheme (`super::scheme`) over its
//! token ids (scheme 1 also over its extra keys: `super::namespace`), which for scheme 1 chains through the parent block's local hash. The session keeps, per lane, the
//! engine ext hash → local hash of every block it has seen stored and not removed, so a store
//! whose parent is an earlier block can be hashed; when the parent's local is unknown the event
//! is refused and counted (mis-hashing it would credit blocks at the wrong trie positions).

use super::metrics::{BridgeMetrics, Refusal};
use super::namespace;
use super::wire::{Batch, Event, Salt, Tokens};
use prefixlog_engine::scheme::OwnedBlockKey;
use prefixlog_engine::BlockHashes;
use prefixlog_state::record::{KvOp, Tier};
use std::collections::{BTreeSet, HashMap, VecDeque};
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// The tier of an engine's storage medium name (any case); `None` means the GPU (older
/// engines send no medium). vLLM: `GPU`, `CPU`; SGLang: `GPU`, `CPU_PINNED`, `DISK`,
/// `EXTERNAL`; LMCache-style names for disk and remote pools. A name outside this table is
/// refused (counted as `medium`), never guessed.
pub fn tier_of_medium(medium: Option<&str>) -> Option<Tier> {
    let Some(m) = medium else { return Some(Tier::Gpu) };
    let m = m.to_ascii_lowercase();
    Some(match m.as_str() {
        "gpu" | "cuda" | "device" | "hbm" => Tier::Gpu,
        "cpu" | "cpu_pinned" | "host" | "host_pinned" | "dram" => Tier::Host,
        "disk" | "local_disk" | "localdisk" | "ssd" | "nvme" => Tier::Disk,
        "external" | "remote" | "storage" | "l3" => Tier::External,
        _ => return None,
    })
}

/// What the session knows of a block stored in this epoch: its local hash and parent (so a
/// store that names only the block's hash, as vLLM's lazy CPU offload sends, can be completed),
/// and the tiers it is held on (it is forgotten once none holds it).
#[derive(Clone, Copy, Debug)]
struct Known {
    local: u64,
    parent: Option<u64>,
    /// Bit `tier.code()` set while the block is held on that tier.
    tiers: u8,
    /// Digest of the top-level `cache_salt` (SGLang) the block was stored under, 0 for none
    /// (a child store must name its parent's salt).
    salt: u64,
}

/// The plain chain hash, where the bridge's tests and callers have always found it.
pub use super::namespace::chain_from;

/// Most unknown field names a stream logs by name (each once).
const MAX_FIELDS_LOGGED: usize = 64;

/// Digest of a message payload, to tell a duplicate from a restarted engine's message.
pub fn payload_digest(payload: &[u8]) -> u64 {
    xxh3_64_with_seed(payload, 0)
}

/// How a message's sequence number relates to the stream so far.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arrival {
    InOrder,
    Duplicate,
    /// Messages `from..seq` are missing.
    Gap {
        from: u64,
    },
    /// The engine restarted: call [`Session::restart`], then classify again.
    Restart,
}

#[derive(Debug)]
pub struct Session {
    block_size: usize,
    /// The keyspace's hash scheme (`super::scheme`): 1 unless [`Session::with_scheme`].
    scheme: u32,
    epoch: u64,
    last: Option<u64>,
    /// The last `window` (seq, payload digest) pairs handled, for duplicate detection.
    recent: VecDeque<(u64, u64)>,
    recent_by_seq: HashMap<u64, u64>,
    window: usize,
    /// (lane, ext) → what is known of the blocks seen stored and not removed in this epoch.
    locals: HashMap<(u32, u64), Known>,
    max_tracked: usize,
    lanes: BTreeSet<u32>,
    /// Lane metadata announced this epoch, and changes not yet published.
    lane_meta: std::collections::BTreeMap<u32, prefixlog_state::LaneMeta>,
    pending_lanes: Vec<prefixlog_state::LaneMeta>,
    /// Unknown field names already logged (once each per stream, bounded).
    fields_logged: BTreeSet<String>,
}

impl Session {
    /// A session for a keyspace of `block_size` tokens per block, starting at `epoch` (the
    /// bridge uses its start time in ms, so a restarted bridge also starts a newer epoch).
    pub fn new(block_size: u32, epoch: u64) -> Self {
        Self {
            block_size: block_size as usize,
            scheme: prefixlog_engine::scheme::SCHEME_XXH3_CHAINED,
            epoch,
            last: None,
            recent: VecDeque::new(),
            recent_by_seq: HashMap::new(),
            window: 65_536,
            locals: HashMap::new(),
            max_tracked: 1 << 22,
            lanes: BTreeSet::new(),
            lane_meta: Default::default(),
            pending_lanes: Vec::new(),
            fields_logged: BTreeSet::new(),
        }
    }

    /// Hashes stored blocks under `scheme` ([`super::scheme::locals_for`]).
    pub fn with_scheme(mut self, scheme: u32) -> Self {
        self.scheme = scheme;
        self
    }

    /// Bounds the ext → local table (blocks whose removals were lost would otherwise stay);
    /// past the bound it is cleared, and stores under forgotten parents are refused.
    pub fn with_max_tracked(mut self, n: usize) -> Self {
        self.max_tracked = n.max(1);
        self
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    pub fn last_seq(&self) -> Option<u64> {
        self.last
    }

    /// The payload digest of message `seq`, if it is among the recent messages handled.
    pub fn digest_of(&self, seq: u64) -> Option<u64> {
        self.recent_by_seq.get(&seq).copied()
    }

    /// The next sequence number expected.
    pub fn expected(&self) -> u64 {
        self.last.map_or(0, |l| l.wrapping_add(1))
    }

    /// Blocks whose local hash the session knows.
    pub fn tracked(&self) -> usize {
        self.locals.len()
    }

    pub fn classify(&self, seq: u64, digest: u64) -> Arrival {
        match self.last {
            Some(l) if seq <= l => {
                if self.recent_by_seq.get(&seq) == Some(&digest) {
                    Arrival::Duplicate
                } else {
                    Arrival::Restart
                }
            }
            _ if seq == self.expected() => Arrival::InOrder,
            _ => Arrival::Gap { from: self.expected() },
        }
    }

    /// Starts a new epoch whose first message is `seq`: what the stream did before can no
    /// longer be proven (a gap replay could not fill, events that could not be read), so every
    /// replica clears the worker's feed on the epoch's first record and the stream starts over.
    pub fn reset_at(&mut self, seq: u64) {
        self.restart();
        self.last = seq.checked_sub(1);
    }

    /// Starts a new epoch in which message `seq` (payload `digest`) is already handled: a
    /// message whose events could not all be read is published as the new epoch's first,
    /// empty record, which clears the worker's feed on every replica.
    pub fn reset_after(&mut self, seq: u64, digest: u64) {
        self.restart();
        self.last = Some(seq);
        self.recent.push_back((seq, digest));
        self.recent_by_seq.insert(seq, digest);
    }

    /// Starts a new epoch: forgets the sequence, the tracked blocks and the lanes.
    pub fn restart(&mut self) {
        self.epoch += 1;
        self.last = None;
        self.recent.clear();
        self.recent_by_seq.clear();
        self.locals.clear();
        self.lanes.clear();
        self.lane_meta.clear();
        self.pending_lanes.clear();
    }

    /// Lane metadata first seen (or changed) since the last call: published with the batch so
    /// replicas can describe hybrid models' holders (kind, window, block size per cache group).
    pub fn take_pending_lanes(&mut self) -> Vec<prefixlog_state::LaneMeta> {
        std::mem::take(&mut self.pending_lanes)
    }

    /// Accepts message `seq` (call in increasing seq order) and translates its events. Refused
    /// and unknown events are counted in `m` and left out; [`Accepted::lost`] says whether any
    /// event was lost in a way that could hide a removal (an unknown event type or a malformed
    /// event), so the record is published with `gap_before` and replicas mark the holder gapped.
    /// Refused *stores* (another medium, a namespace the bridge cannot hash, an unknown parent)
    /// only leave blocks out of the index: an undercount, never an overcount, so no gap.
    pub fn accept(&mut self, seq: u64, digest: u64, batch: &Batch, m: &BridgeMetrics) -> Accepted {
        self.last = Some(seq);
        self.recent.push_back((seq, digest));
        self.recent_by_seq.insert(seq, digest);
        while self.recent.len() > self.window {
            if let Some((s, _)) = self.recent.pop_front() {
                self.recent_by_seq.remove(&s);
            }
        }
        BridgeMetrics::add(&m.events_received, batch.events.len() as u64);
        BridgeMetrics::add(&m.fields_ignored, batch.ignored_fields);
        self.log_unknown_fields(seq, &batch.ignored_names);
        let mut ops = Vec::with_capacity(batch.events.len());
        for e in &batch.events {
            if let Event::Cleared = e {
                // AllBlocksCleared → one `Cleared` per lane seen in this epoch (at least 0).
                self.locals.clear();
                self.lanes.insert(0);
                ops.extend(self.lanes.iter().map(|&lane| KvOp::Cleared { lane }));
                continue;
            }
            match self.translate(e) {
                Ok(Some(op)) => ops.push(op),
                Ok(None) => {}
                Err(r) => {
                    // Logged at the 1st, 2nd, 4th, 8th … refusal of each reason: a steady
                    // stream (LoRA traffic, an offload tier) must not flood the log.
                    let n = m.refused(r).fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
                    if n.is_power_of_two() {
                        tracing::warn!(reason = r.as_str(), seq, refused = n, event = %brief(e), "bridge: event refused");
                    }
                }
            }
            if let Event::Unknown(_) = e {
                BridgeMetrics::inc(&m.events_unknown_type);
            }
        }
        if self.locals.len() > self.max_tracked {
            tracing::warn!(tracked = self.locals.len(), "bridge: ext→local table over its bound, cleared");
            self.locals.clear();
        }
        let lost = batch.events.iter().any(|e| matches!(e, Event::Unknown(_) | Event::Malformed(_)));
        Accepted { ops, lost }
    }

    /// Logs each unknown field name the first time this stream sees it (at most
    /// [`MAX_FIELDS_LOGGED`] names; every occurrence is counted in `fields_ignored`).
    fn log_unknown_fields(&mut self, seq: u64, names: &[String]) {
        for n in names {
            if self.fields_logged.len() < MAX_FIELDS_LOGGED && self.fields_logged.insert(n.clone()) {
                tracing::warn!(
                    seq,
                    field = %n,
                    "bridge: the engine sends a field this bridge does not know (stores carrying it are refused as unknown_field; logged once per field)"
                );
            }
        }
    }

    fn translate(&mut self, e: &Event) -> Result<Option<KvOp>, Refusal> {
        match e {
            Event::Stored {
                hashes,
                parent,
                tokens,
                block_size,
                medium,
                group_idx,
                lora_id,
                lora_name,
                extra_keys,
                kv_cache_spec_kind,
                kv_cache_spec_sliding_window,
                lookahead,
                cache_salt,
                residency,
                mm_infos,
                unknown,
                ..
            } => {
                if !unknown.is_empty() {
                    return Err(Refusal::UnknownField);
                }
                if !residency.is_own() {
                    return Err(Refusal::Residency);
                }
                let tier = tier_of_medium(medium.as_deref()).ok_or(Refusal::Medium)?;
                let lane = group_idx.unwrap_or(0);
                if tier != Tier::Gpu && matches!(tokens, Tokens::Ids(ids) if ids.is_empty()) {
                    return self.offloaded(tier, lane, *parent, hashes);
                }
                if *mm_infos {
                    return Err(Refusal::ExtraKeys);
                }
                // An adapter named by lora_name is a namespace of its own (its chain starts from
                // the name's seed); multimodal inputs, the cache salt and lookahead tokens key
                // their blocks.
                let mut keys =
                    namespace::block_keys(extra_keys, lora_name.as_deref(), *lora_id, hashes.len())?;
                namespace::add_lookahead(&mut keys, lookahead)?;
                let salt = match cache_salt {
                    Salt::Absent => 0,
                    Salt::Text(s) => xxh3_64_with_seed(s.as_bytes(), 0) | 1,
                    Salt::Unparsed => return Err(Refusal::Salt),
                };
                let ids = match tokens {
                    Tokens::Ids(ids) => std::borrow::Cow::Borrowed(&ids[..]),
                    Tokens::Bigrams(pairs) => namespace::unpair(pairs).ok_or(Refusal::Tokens)?.into(),
                    Tokens::Unsupported => return Err(Refusal::Tokens),
                };
                let bs = self.block_size;
                if bs == 0
                    || block_size.is_some_and(|b| b != bs as u64)
                    || ids.len() != hashes.len().saturating_mul(bs)
                {
                    return Err(Refusal::TokenCount);
                }
                if let Tokens::Bigrams(pairs) = tokens {
                    namespace::add_bigram_lookahead(&mut keys, pairs, bs, lookahead)?;
                }
                let (seed, salt) = match parent {
                    None => {
                        // SGLang's salt names the whole tree under the root: a key of the
                        // prompt's first block, as vLLM (and a gateway's query) puts it.
                        if let (Salt::Text(s), Some(first)) = (cache_salt, keys.first_mut()) {
                            first.push(OwnedBlockKey::Text(s.clone()));
                        }
                        (prefixlog_engine::scheme::namespace_seed(lora_name.as_deref().unwrap_or("")), salt)
                    }
                    Some(p) => {
                        let known = self.locals.get(&(lane, *p)).ok_or(Refusal::UnknownParent)?;
                        // A child's salt is its parent's: its local chains from the parent's,
                        // which carries it. A store naming another salt is not that chain.
                        if salt != 0 && salt != known.salt {
                            return Err(Refusal::Salt);
                        }
                        (known.local, known.salt)
                    }
                };
                let locals =
                    super::scheme::locals_for(self.scheme, seed, &ids, bs, &keys, lora_name.as_deref())?;
                self.lanes.insert(lane);
                if group_idx.is_some() || kv_cache_spec_kind.is_some() {
                    let meta = prefixlog_state::LaneMeta {
                        lane,
                        kind: kv_cache_spec_kind.clone().unwrap_or_default(),
                        sliding_window: kv_cache_spec_sliding_window
                            .map_or(0, |w| w.min(u64::from(u32::MAX)) as u32),
                        block_size: bs as u32,
                    };
                    if self.lane_meta.get(&lane) != Some(&meta) {
                        self.lane_meta.insert(lane, meta.clone());
                        self.pending_lanes.push(meta);
                    }
                }
                let parents = std::iter::once(*parent).chain(hashes.iter().map(|&h| Some(h)));
                for ((&ext, &local), parent) in hashes.iter().zip(&locals).zip(parents) {
                    let known =
                        self.locals.entry((lane, ext)).or_insert(Known { local, parent, tiers: 0, salt });
                    (known.local, known.parent, known.salt) = (local, parent, salt);
                    known.tiers |= 1 << tier.code();
                }
                Ok(Some(KvOp::Stored {
                    tier,
                    lane,
                    parent_ext: *parent,
                    blocks: hashes.iter().copied().zip(locals).map(BlockHashes::from).collect(),
                }))
            }
            Event::Removed { hashes, medium, group_idx, residency } => {
                if !residency.is_own() {
                    // A remote or secondary copy's removal: the bridge never credited its store.
                    return Err(Refusal::Residency);
                }
                let tier = tier_of_medium(medium.as_deref()).ok_or(Refusal::Medium)?;
                let lane = group_idx.unwrap_or(0);
                self.lanes.insert(lane);
                for h in hashes {
                    if let Some(known) = self.locals.get_mut(&(lane, *h)) {
                        known.tiers &= !(1 << tier.code());
                        if known.tiers == 0 {
                            self.locals.remove(&(lane, *h));
                        }
                    }
                }
                Ok(Some(KvOp::Removed { tier, lane, exts: hashes.clone() }))
            }
            // Handled by `accept` (one op per lane).
            Event::Cleared | Event::Unknown(_) => Ok(None),
            Event::Malformed(_) => Err(Refusal::Malformed),
        }
    }

    /// A store on another tier that names only block hashes (vLLM's lazy CPU offload copies
    /// blocks still on the GPU): completed from what the GPU store said of each block. A block
    /// the session does not know is refused (`unknown_parent`): its position cannot be known.
    fn offloaded(
        &mut self,
        tier: Tier,
        lane: u32,
        parent: Option<u64>,
        hashes: &[u64],
    ) -> Result<Option<KvOp>, Refusal> {
        let mut blocks = Vec::with_capacity(hashes.len());
        for &ext in hashes {
            let known = self.locals.get(&(lane, ext)).ok_or(Refusal::UnknownParent)?;
            blocks.push(BlockHashes::new(ext, known.local));
        }
        let Some(&first) = hashes.first() else { return Ok(None) };
        let parent_ext = parent.or_else(|| self.locals[&(lane, first)].parent);
        for &ext in hashes {
            self.locals.get_mut(&(lane, ext)).expect("known above").tiers |= 1 << tier.code();
        }
        self.lanes.insert(lane);
        Ok(Some(KvOp::Stored { tier, lane, parent_ext, blocks }))
    }

    /// Lanes seen in this epoch.
    pub fn lanes(&self) -> Vec<u32> {
        self.lanes.iter().copied().collect()
    }
}

/// A message's translation.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Accepted {
    pub ops: Vec<KvOp>,
    /// An event of the message could not be decoded or was of an unknown type.
    pub lost: bool,
}

fn brief(e: &Event) -> String {
    match e {
        Event::Stored { hashes, parent, tokens, .. } => format!(
            "BlockStored({} hashes, parent {parent:?}, {} tokens)",
            hashes.len(),
            match tokens {
                Tokens::Ids(t) => t.len().to_string(),
                Tokens::Bigrams(p) => format!("{} bigram", p.len()),
                Tokens::Unsupported => "unsupported".into(),
            }
        ),
        Event::Removed { hashes, .. } => format!("BlockRemoved({} hashes)", hashes.len()),
        Event::Cleared => "AllBlocksCleared".into(),
        Event::Unknown(t) => format!("unknown event {t:?}"),
        Event::Malformed(f) => format!("malformed ({f})"),
    }
}
