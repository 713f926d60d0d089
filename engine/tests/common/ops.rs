//! Operations as data: a differential run is a list of [`Step`]s (one write plus the queries
//! checked after it), so a failing run can be replayed, shrunk and printed as Rust.

use super::RefModel;
use prefixlog_engine::{
    BlockHashes, EngineConfig, HolderKey, Keyspace, KeyspaceId, MatchOptions, PlaceOutcome, Tier,
};
use std::fmt::Write;

/// One write (or a rebuild) applied to both the engine and the model.
#[derive(Clone, Debug)]
pub enum Op {
    Store {
        key: HolderKey,
        parent: Option<u64>,
        blocks: Vec<BlockHashes>,
        t: u64,
    },
    Remove {
        key: HolderKey,
        exts: Vec<u64>,
        t: u64,
    },
    Clear {
        key: HolderKey,
        t: u64,
    },
    DropWorker {
        worker: u64,
    },
    Place {
        key: HolderKey,
        locals: Vec<u64>,
        t: u64,
    },
    /// Expiry of one log partition's holders at log time `t`.
    Expire {
        t: u64,
        partition: u32,
    },
    SetGapped {
        key: HolderKey,
        gapped: bool,
    },
    SetPartitionGapped {
        partition: u32,
    },
    /// Replace the engine with `rebuild(dump())` (the model is unaffected).
    Rebuild,
    /// Replace the engine with `read_image(write_image())`.
    Image,
}

/// A write and the queries compared after it.
#[derive(Clone, Debug)]
pub struct Step {
    pub op: Op,
    pub queries: Vec<(Vec<u64>, MatchOptions)>,
}

/// Applies `op` to the model. Returns the model's verdict for stores and placements.
pub fn apply_model(model: &mut RefModel, op: &Op) -> Option<bool> {
    match op {
        Op::Store { key, parent, blocks, t } => return Some(model.store(*key, *parent, blocks, *t)),
        Op::Remove { key, exts, t } => model.remove(*key, exts, *t),
        Op::Clear { key, t } => model.clear(*key, *t),
        Op::DropWorker { worker } => model.drop_worker(*worker),
        Op::Place { key, locals, t } => return Some(model.place(*key, locals, *t)),
        Op::Expire { t, partition } => model.expire(*t, *partition),
        Op::SetGapped { key, gapped } => model.set_gapped(*key, *gapped),
        Op::SetPartitionGapped { partition } => model.set_partition_gapped(*partition),
        Op::Rebuild | Op::Image => {}
    }
    None
}

/// Applies `op` to the engine, with the same verdicts as [`apply_model`].
pub fn apply_engine(ks: &mut Keyspace, cfg: &EngineConfig, op: &Op) -> Result<Option<bool>, String> {
    match op {
        Op::Store { key, parent, blocks, t } => return Ok(Some(ks.store(*key, *parent, blocks, *t).is_ok())),
        Op::Remove { key, exts, t } => {
            ks.remove(*key, exts, *t);
        }
        Op::Clear { key, t } => {
            ks.clear(*key, *t);
        }
        Op::DropWorker { worker } => {
            ks.drop_worker(*worker);
        }
        Op::Place { key, locals, t } => {
            return Ok(Some(ks.place(*key, locals, *t) != PlaceOutcome::IgnoredFed))
        }
        Op::Expire { t, partition } => {
            ks.expire(*t, *partition);
        }
        Op::SetGapped { key, gapped } => ks.set_gapped(*key, *gapped),
        Op::SetPartitionGapped { partition } => ks.set_partition_gapped(*partition),
        Op::Rebuild => {
            let dump = ks.dump();
            *ks = Keyspace::rebuild(&dump, cfg.clone())
                .map_err(|e| format!("own dump does not rebuild: {e}"))?;
            if ks.dump() != dump {
                return Err("the dump of a rebuild differs from the dump it was built from".into());
            }
        }
        Op::Image => {
            let (dump, mut image) = (ks.dump(), Vec::new());
            ks.write_image(&mut image).map_err(|e| format!("write_image: {e}"))?;
            *ks = Keyspace::read_image(&image, cfg.clone())
                .map_err(|e| format!("own image does not read: {e}"))?;
            if ks.dump() != dump {
                return Err("the dump of a restored image differs from the original's".into());
            }
        }
    }
    Ok(None)
}

/// A fresh keyspace for differential runs.
pub fn keyspace(cfg: &EngineConfig) -> Keyspace {
    Keyspace::new(KeyspaceId::new("m", 16, 1), cfg.clone())
}

fn key(k: &HolderKey) -> String {
    let on = if k.tier == Tier::Gpu { String::new() } else { format!(".on(Tier::{:?})", k.tier) };
    format!("HolderKey::new({}, {}, {}){on}", k.worker, k.dp_rank, k.lane)
}

fn opt_hex(p: &Option<u64>) -> String {
    p.map_or("None".into(), |p| format!("Some({p:#x})"))
}

fn op_rust(op: &Op) -> String {
    match op {
        Op::Store { key: k, parent, blocks, t } => {
            let b: Vec<String> =
                blocks.iter().map(|b| format!("({:#x}, {}).into()", b.ext, b.local)).collect();
            let (k, p, b) = (key(k), opt_hex(parent), b.join(", "));
            format!("Op::Store {{ key: {k}, parent: {p}, blocks: vec![{b}], t: {t} }}")
        }
        Op::Remove { key: k, exts, t } => {
            let e: Vec<String> = exts.iter().map(|e| format!("{e:#x}")).collect();
            format!("Op::Remove {{ key: {}, exts: vec![{}], t: {t} }}", key(k), e.join(", "))
        }
        Op::Clear { key: k, t } => format!("Op::Clear {{ key: {}, t: {t} }}", key(k)),
        Op::DropWorker { worker } => format!("Op::DropWorker {{ worker: {worker} }}"),
        Op::Place { key: k, locals, t } => {
            format!("Op::Place {{ key: {}, locals: vec!{locals:?}, t: {t} }}", key(k))
        }
        Op::Expire { t, partition } => format!("Op::Expire {{ t: {t}, partition: {partition} }}"),
        Op::SetGapped { key: k, gapped } => format!("Op::SetGapped {{ key: {}, gapped: {gapped} }}", key(k)),
        Op::SetPartitionGapped { partition } => {
            format!("Op::SetPartitionGapped {{ partition: {partition} }}")
        }
        Op::Rebuild => "Op::Rebuild".into(),
        Op::Image => "Op::Image".into(),
    }
}

fn opts_rust(o: &MatchOptions) -> String {
    let cands = o.candidates.as_ref().map_or("None".into(), |c| format!("Some(vec!{c:?})"));
    format!(
        "MatchOptions {{ intervals: {}, top_k: {:?}, lane: {:?}, candidates: {cands}, exclude_gapped: {}, \
         tiers: vec!{:?}, tier_weights: {:?} }}",
        o.intervals, o.top_k, o.lane, o.exclude_gapped, o.tiers, o.tier_weights
    )
}

/// The steps as a Rust expression of type `Vec<Step>`, for pasting into a replay test.
pub fn to_rust(steps: &[Step]) -> String {
    let mut s = String::from("vec![\n");
    for st in steps {
        let qs: Vec<String> =
            st.queries.iter().map(|(q, o)| format!("(vec!{q:?}, {})", opts_rust(o))).collect();
        let _ = writeln!(s, "    Step {{ op: {}, queries: vec![{}] }},", op_rust(&st.op), qs.join(", "));
    }
    s + "]"
}
