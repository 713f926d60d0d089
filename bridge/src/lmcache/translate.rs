//! LMCache batches → prefixlog records: a pure function of each instance's batch sequence
//! (its Kafka partition order), so a restarted bridge that reads the topic again writes the
//! same records under the same `(epoch, seq)`, which replicas drop as duplicates.
//!
//! Per instance (worker `--instance ID=WORKER`, else [`crate::worker_id_of_pod`] of its id):
//! one feed per keyspace `(model, --chunk-size, scheme 1)` it stores chunks of, dp rank 0. An
//! admitted batch becomes one record on *every* feed of the instance (empty where nothing
//! changed there), with `epoch = incarnation` and `seq = seq`: each feed's sequence stays
//! contiguous, so a record lost on the way is a gap the replicas see.
//!
//! - a gap (LMCache's gate admits and flags it): the instance's chunks are forgotten, and the
//!   record clears every lane of each feed before its own events (`gap_before` set): a delete
//!   lost in the gap cannot leave a chunk credited;
//! - a restart (higher incarnation): the replicas clear the feeds on the new epoch (every
//!   tier); LMCache voids only L1, so the chunks still held on L2 are stored again in the
//!   first record of the new incarnation (up to `carry_over` chunks);
//! - duplicates and older incarnations publish nothing.

use super::chunks::{ChunkTable, Limits, Ns, Place, Stored};
use super::gate::{self, Admit, Cursor, Verdict};
use super::metrics::{LmMetrics, Refusal};
use super::wire::{self, Batch, Entry, EventType, LmTier};
use prefixlog_engine::{scheme, KeyspaceId, Tier};
use prefixlog_state::record::KvOp;
use std::collections::{BTreeMap, BTreeSet};

/// Worker metadata key naming the LMCache instance a worker's chunks come from.
pub const META_LMCACHE_INSTANCE: &str = "lmcache_instance_id";

/// Instances one bridge tracks.
pub const MAX_INSTANCES: usize = 4096;

/// What the bridge is told.
#[derive(Clone, Debug)]
pub struct Config {
    /// LMCache's `chunk_size`: the keyspaces' block size.
    pub chunk_size: u32,
    pub max_chunks: usize,
    pub parent_candidates: usize,
    /// Chunks stored again after a restart, at most.
    pub carry_over: usize,
    /// Worker ids of named instances (others: derived from the id).
    pub workers: BTreeMap<String, u64>,
}

impl Config {
    pub fn new(chunk_size: u32) -> Self {
        Self {
            chunk_size,
            max_chunks: 1 << 20,
            parent_candidates: 64,
            carry_over: 8192,
            workers: BTreeMap::new(),
        }
    }
}

/// One record to publish.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FeedRecord {
    pub worker: u64,
    pub keyspace: KeyspaceId,
    pub epoch: u64,
    pub seq: u64,
    pub gap_before: bool,
    pub ops: Vec<KvOp>,
}

/// What one admitted batch asks the bridge to publish.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Output {
    /// The LMCache instance and the incarnation of the batch.
    pub instance: String,
    pub incarnation: u64,
    /// The worker's `WorkerAdded` metadata, the first time the instance is seen.
    pub announce: Option<(u64, BTreeMap<String, String>)>,
    pub records: Vec<FeedRecord>,
}

struct Feed {
    keyspace: KeyspaceId,
    lanes: BTreeSet<u32>,
}

struct Instance {
    worker: u64,
    cursor: Option<Cursor>,
    table: ChunkTable,
    feeds: Vec<Feed>,
    /// The next admitted batch is translated as a gap (see [`Translator::start_over`]).
    start_over: bool,
}

pub struct Translator {
    cfg: Config,
    instances: BTreeMap<String, Instance>,
    metrics: LmMetrics,
}

impl Translator {
    pub fn new(cfg: Config, metrics: LmMetrics) -> Self {
        Self { cfg, instances: BTreeMap::new(), metrics }
    }

    pub fn metrics(&self) -> &LmMetrics {
        &self.metrics
    }

    /// One Kafka record's value: its batches in order. An undecodable record is refused whole
    /// (LMCache's consumer drops it too): its batches' seqs become a gap.
    pub fn offer_record(&mut self, value: &[u8]) -> Result<Vec<Output>, wire::WireError> {
        LmMetrics::inc(&self.metrics.records, "read");
        let batches =
            wire::decode(value).inspect_err(|_| LmMetrics::inc(&self.metrics.records, "undecodable"))?;
        Ok(batches.iter().filter_map(|b| self.offer_batch(b)).collect())
    }

    /// One validated batch; `None` when it publishes nothing.
    pub fn offer_batch(&mut self, b: &Batch) -> Option<Output> {
        let m = self.metrics.clone();
        let mut announce = None;
        if !self.instances.contains_key(&b.instance_id) {
            if self.instances.len() >= MAX_INSTANCES {
                LmMetrics::inc(&m.batches, "too_many_instances");
                return None;
            }
            let worker = self
                .cfg
                .workers
                .get(&b.instance_id)
                .copied()
                .unwrap_or_else(|| crate::worker_id_of_pod(&b.instance_id));
            let limits = Limits {
                chunk_size: self.cfg.chunk_size,
                max_chunks: self.cfg.max_chunks,
                parent_candidates: self.cfg.parent_candidates,
            };
            let meta = BTreeMap::from([(META_LMCACHE_INSTANCE.to_string(), b.instance_id.clone())]);
            announce = Some((worker, meta));
            self.instances.insert(
                b.instance_id.clone(),
                Instance {
                    worker,
                    cursor: None,
                    table: ChunkTable::new(limits),
                    feeds: Vec::new(),
                    start_over: false,
                },
            );
        }
        let inst = self.instances.get_mut(&b.instance_id).expect("inserted");
        let (incarnation, seq) = (b.incarnation as u64, b.seq as u64);
        let admit = match gate::offer(&mut inst.cursor, incarnation, seq) {
            Verdict::Admit(a) if std::mem::take(&mut inst.start_over) => Admit { gap: true, ..a },
            Verdict::Admit(a) => a,
            Verdict::Duplicate => {
                LmMetrics::inc(&m.batches, "duplicate");
                return announce.map(|a| Output::announcing(b, a));
            }
            Verdict::Stale => {
                LmMetrics::inc(&m.batches, "stale");
                return announce.map(|a| Output::announcing(b, a));
            }
        };
        LmMetrics::inc(&m.batches, "admitted");
        let records = inst.translate(b, admit, &self.cfg, &m);
        Some(Output { instance: b.instance_id.clone(), incarnation, announce, records })
    }
}

impl Translator {
    /// Makes the instance's next admitted batch clear every feed of the instance before its own
    /// events, as a gap does: what the bridge knows of it may lack chunks an earlier run
    /// credited (the topic no longer starts where that run read), so a later delete of one would
    /// publish nothing. Cleared, the instance is exact again and never left gapped.
    pub fn start_over(&mut self, instance: &str) {
        if let Some(inst) = self.instances.get_mut(instance) {
            inst.start_over = true;
        }
    }
}

impl Output {
    fn announcing(b: &Batch, a: (u64, BTreeMap<String, String>)) -> Self {
        Output {
            instance: b.instance_id.clone(),
            incarnation: b.incarnation as u64,
            announce: Some(a),
            records: Vec::new(),
        }
    }
}

/// The newest incarnation of each instance in a stretch of the stream (records that do not
/// decode are skipped): what a restarted bridge reads first.
///
/// A restarted bridge translates the topic from its start again but publishes an
/// instance's records only from its newest incarnation in what was already there: records of
/// an older incarnation were published before (or are superseded by the newer one, whose
/// first record stores again what LMCache keeps), and a replica given an epoch older than a
/// feed's would mark the instance gapped (two writers of one feed).
pub fn newest_incarnations<'a>(values: impl IntoIterator<Item = &'a [u8]>) -> BTreeMap<String, u64> {
    #[derive(serde::Deserialize)]
    struct Head {
        instance_id: String,
        incarnation: u64,
    }
    #[derive(serde::Deserialize)]
    struct Heads {
        #[serde(default)]
        batches: Vec<Head>,
    }
    let mut out = BTreeMap::new();
    for v in values {
        let Ok(h) = serde_json::from_slice::<Heads>(v) else { continue };
        for b in h.batches {
            let e = out.entry(b.instance_id).or_insert(b.incarnation);
            *e = (*e).max(b.incarnation);
        }
    }
    out
}

/// Whether a restarted bridge publishes `o` (see [`newest_incarnations`]).
pub fn is_current(o: &Output, newest: &BTreeMap<String, u64>) -> bool {
    newest.get(&o.instance).is_none_or(|&n| o.incarnation >= n)
}

impl Instance {
    fn translate(&mut self, b: &Batch, admit: Admit, cfg: &Config, m: &LmMetrics) -> Vec<FeedRecord> {
        let mut ops: Vec<(u32, KvOp)> = Vec::new();
        if admit.gap {
            LmMetrics::inc(&m.streams, "gap");
            self.table.clear();
        } else if admit.restart {
            LmMetrics::inc(&m.streams, "restart");
            let (carried, dropped) = self.table.fence_l1(cfg.carry_over, &mut ops);
            LmMetrics::add(&m.chunks, "carried_over", carried);
            LmMetrics::add(&m.chunks, "carry_over_dropped", dropped);
        }
        for e in &b.entries {
            if let Err(r) = self.entry(b, e, &mut ops) {
                m.refuse(r);
            }
        }
        let mut per_feed: Vec<Vec<KvOp>> = Vec::new();
        for (ns, op) in ops {
            match &op {
                KvOp::Stored { .. } => LmMetrics::inc(&m.chunks, "stored"),
                KvOp::Removed { .. } => LmMetrics::inc(&m.chunks, "removed"),
                KvOp::Cleared { .. } => {}
            }
            let f = self.feed_of(ns, cfg.chunk_size);
            per_feed.resize_with(self.feeds.len(), Vec::new);
            push_merged(&mut per_feed[f], op);
        }
        per_feed.resize_with(self.feeds.len(), Vec::new);
        let mut out = Vec::with_capacity(self.feeds.len());
        for (feed, mut ops) in self.feeds.iter_mut().zip(per_feed) {
            feed.lanes.extend(ops.iter().map(KvOp::lane));
            if admit.gap {
                let clears = feed.lanes.iter().map(|&lane| KvOp::Cleared { lane });
                ops = clears.chain(ops).collect();
            }
            out.push(FeedRecord {
                worker: self.worker,
                keyspace: feed.keyspace.clone(),
                epoch: b.incarnation as u64,
                seq: b.seq as u64,
                gap_before: admit.gap,
                ops,
            });
        }
        out
    }

    /// The feed of a namespace's keyspace (created in first-seen order).
    fn feed_of(&mut self, ns: u32, chunk_size: u32) -> usize {
        let ks = KeyspaceId::new(self.table.ns(ns).model.clone(), chunk_size, scheme::SCHEME_XXH3_CHAINED);
        if let Some(i) = self.feeds.iter().position(|f| f.keyspace == ks) {
            return i;
        }
        self.feeds.push(Feed { keyspace: ks, lanes: BTreeSet::new() });
        self.feeds.len() - 1
    }

    fn entry(&mut self, b: &Batch, e: &Entry, ops: &mut Vec<(u32, KvOp)>) -> Result<(), Refusal> {
        let hash = wire::chunk_hash(&e.key.chunk_hash_hex).ok_or(Refusal::HashLength)?;
        let ns = Ns {
            model: e.key.model_name.clone(),
            salt: e.key.cache_salt.clone(),
            group: u32::try_from(e.key.object_group_id).map_err(|_| Refusal::KvRank)?,
        };
        match b.event_type {
            EventType::Config => Ok(()),
            EventType::Access => {
                if let Some(ns) = self.table.ns_index(&ns) {
                    self.table.touch(ns, &hash);
                }
                Ok(())
            }
            EventType::Store | EventType::Delete => {
                let place = self.place(b)?;
                let ns = self.table.intern(ns)?;
                let (world, rank) = wire::kv_rank_parts(e.key.kv_rank);
                if b.event_type == EventType::Delete {
                    self.table.delete(ns, &hash, rank, place, ops);
                    return Ok(());
                }
                let s = Stored {
                    ns,
                    hash: &hash,
                    world,
                    rank,
                    place,
                    tokens: &e.token_ids,
                    offset: e.token_offset,
                };
                self.table.store(&s, ops)
            }
        }
    }

    /// The placement of a store or delete batch, and the tier it is credited on.
    fn place(&mut self, b: &Batch) -> Result<Place, Refusal> {
        if b.shared {
            return Err(Refusal::Shared);
        }
        let tier = tier_of(b.tier, &b.backend)?;
        Ok(Place { lm: b.tier, backend: self.table.backend(&b.backend)?, tier })
    }
}

/// The prefixlog tier of an LMCache placement: L1 in the MP server's memory (`dram`,
/// `devdax`) is the host tier, L1 on GPUDirect storage (`gds`) the disk tier; every L2
/// backend (an adapter outside the server: fs, s3, valkey, ...) the external tier.
pub fn tier_of(tier: LmTier, backend: &str) -> Result<Tier, Refusal> {
    match (tier, backend) {
        (LmTier::L1, "dram" | "devdax") => Ok(Tier::Host),
        (LmTier::L1, "gds") => Ok(Tier::Disk),
        (LmTier::L2, _) => Ok(Tier::External),
        _ => Err(Refusal::Backend),
    }
}

/// Appends `op`, joining it to the previous one where one record op can say both: a store
/// that continues the previous store's chain on the same tier and lane, or a removal on the
/// same tier and lane.
fn push_merged(ops: &mut Vec<KvOp>, op: KvOp) {
    match (ops.last_mut(), &op) {
        (
            Some(KvOp::Stored { tier: t1, lane: l1, blocks: b1, .. }),
            KvOp::Stored { tier, lane, parent_ext: Some(p), blocks },
        ) if t1 == tier && l1 == lane && b1.last().map(|b| b.ext) == Some(*p) => b1.extend_from_slice(blocks),
        (Some(KvOp::Removed { tier: t1, lane: l1, exts: e1 }), KvOp::Removed { tier, lane, exts })
            if t1 == tier && l1 == lane =>
        {
            e1.extend_from_slice(exts)
        }
        _ => ops.push(op),
    }
}
