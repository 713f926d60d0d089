//! prefixlog's own engine, driven as a replica drives it: one keyspace behind its
//! `parking_lot::RwLock`, a write lock per event and a read lock per query. Queries reuse one
//! result buffer (`match_chain_into`), as smg's adapter reuses its scratch and output buffers.

use crate::index::Index;
use prefixlog_engine::{
    BlockHashes, Engine, EngineConfig, HolderKey, HolderMatch, KeyspaceId, MatchOptions, SharedKeyspace,
};

pub struct Prefixlog {
    _engine: Engine,
    ks: SharedKeyspace,
    rejected: u64,
    t: u64,
    out: Vec<HolderMatch>,
}

impl Prefixlog {
    pub fn new() -> Self {
        let engine = Engine::new(EngineConfig::default());
        let ks = engine.keyspace_or_create(&KeyspaceId::new("trace", 64, 1));
        Self { _engine: engine, ks, rejected: 0, t: 0, out: Vec::new() }
    }
}

impl Index for Prefixlog {
    fn name(&self) -> &str {
        "prefixlog"
    }

    fn stored(&mut self, worker: u32, parent: Option<u64>, blocks: &[BlockHashes]) {
        self.t += 1;
        let key = HolderKey::new(u64::from(worker), 0, 0);
        if self.ks.write(|k| k.store(key, parent, blocks, self.t)).is_err() {
            self.rejected += 1;
        }
    }

    fn removed(&mut self, worker: u32, exts: &[u64]) {
        self.t += 1;
        self.ks.write(|k| k.remove(HolderKey::new(u64::from(worker), 0, 0), exts, self.t));
    }

    fn query(&mut self, locals: &[u64]) -> Vec<(u32, u32)> {
        self.ks.read().match_chain_into(locals, &MatchOptions::default(), &mut self.out);
        self.out.iter().map(|m| (m.holder.worker as u32, m.depth)).collect()
    }

    fn notes(&self) -> String {
        let ks = self.ks.read();
        format!(
            "stores rejected (missing parent): {}; nodes {}, holder-blocks {}, holders {}, arena+tables ~{} MiB",
            self.rejected,
            ks.node_count(),
            ks.holder_blocks(),
            ks.holder_count(),
            ks.heap_bytes() >> 20
        )
    }
}
