//! Rebuilding the state at a past point.

use indicatif::{ProgressBar, ProgressStyle};
use prefixlog_engine::{Engine, EngineConfig};
use prefixlog_ingest::{Applier, ApplyConfig};
use prefixlog_snapshot::{restore, CheckpointMeta, CheckpointStore};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use std::time::Duration;

/// Where to stop.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Point {
    /// Next offsets per partition (what a query response's `applied` offsets say): every record
    /// below them is applied, none at or above. Partitions not named are taken to their end.
    Offsets(Vec<(u32, i64)>),
    /// Log time in ms: per partition, every record before the first one stamped after it.
    Time(u64),
}

/// The log to replay and what is known about its retained range.
#[derive(Clone, Debug)]
pub struct LogSource {
    pub brokers: String,
    pub topic: String,
    pub partitions: u32,
    pub properties: Vec<(String, String)>,
    /// First retained offset per partition (0 unless retention dropped records).
    pub low_watermarks: Vec<i64>,
    /// End of each partition.
    pub high_watermarks: Vec<i64>,
}

#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error(
        "the requested point is older than anything retained: {why}. Earliest reachable point: {earliest}"
    )]
    TooOld { why: String, earliest: String },
    #[error("the requested point is beyond the end of the log (partition {partition}: asked {asked}, log ends at {end})")]
    BeyondEnd { partition: u32, asked: i64, end: i64 },
    #[error("checkpoint {0}: {1}")]
    Checkpoint(u64, String),
    #[error("kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
}

/// The state at the point.
pub struct Reconstructed {
    pub applier: Applier,
    /// The checkpoint replay started from (None: the log start).
    pub checkpoint: Option<u64>,
    /// Records replayed on top of it.
    pub replayed: u64,
}

impl Reconstructed {
    pub fn offsets(&self) -> Vec<i64> {
        self.applier.offsets()
    }
}

fn target_offsets(point: &Point, log: &LogSource) -> Result<Option<Vec<i64>>, AuditError> {
    let Point::Offsets(o) = point else { return Ok(None) };
    let mut t = log.high_watermarks.clone();
    for &(p, off) in o {
        let end = *log.high_watermarks.get(p as usize).unwrap_or(&0);
        if off > end {
            return Err(AuditError::BeyondEnd { partition: p, asked: off, end });
        }
        if let Some(x) = t.get_mut(p as usize) {
            *x = off;
        }
    }
    Ok(Some(t))
}

fn usable(meta: &CheckpointMeta, point: &Point, target: &Option<Vec<i64>>) -> bool {
    match (point, target) {
        (Point::Offsets(_), Some(t)) => meta.offsets.iter().zip(t).all(|(c, t)| c <= t),
        (Point::Time(time), _) => meta.log_times.iter().all(|lt| lt <= time),
        _ => false,
    }
}

/// Rebuilds the state at `point`: newest usable retained checkpoint, then exact replay.
pub fn reconstruct(
    store: Option<&CheckpointStore>,
    log: &LogSource,
    point: &Point,
    engine_cfg: EngineConfig,
    apply_cfg: ApplyConfig,
    progress: bool,
) -> Result<Reconstructed, AuditError> {
    let target = target_offsets(point, log)?;
    let mut base = None;
    let mut oldest: Option<CheckpointMeta> = None;
    if let Some(store) = store {
        for id in store.ids() {
            let Ok(meta) = store.meta(id) else { continue };
            if meta.identity.topic != log.topic || meta.identity.partitions != log.partitions {
                continue;
            }
            oldest = Some(meta.clone());
            if base.is_none() && usable(&meta, point, &target) {
                base = Some(meta);
            }
        }
    }
    let log_from_start = log.low_watermarks.iter().all(|&l| l == 0);
    let (mut applier, checkpoint) = match &base {
        Some(meta) => {
            let l = store
                .expect("store")
                .load(meta.id)
                .map_err(|e| AuditError::Checkpoint(meta.id, e.to_string()))?;
            let a = restore(&l, engine_cfg, apply_cfg).map_err(|e| AuditError::Checkpoint(meta.id, e))?;
            (a, Some(meta.id))
        }
        None if log_from_start => {
            (Applier::new(std::sync::Arc::new(Engine::new(engine_cfg)), apply_cfg), None)
        }
        None => {
            let earliest = match &oldest {
                Some(m) => {
                    format!("checkpoint {} (log time {} ms, offsets {:?})", m.id, m.log_time(), m.offsets)
                }
                None => format!(
                    "none: no retained checkpoint, and the log starts at offsets {:?}",
                    log.low_watermarks
                ),
            };
            return Err(AuditError::TooOld {
                why: "no retained checkpoint is at or before it and the log no longer starts at offset 0"
                    .into(),
                earliest,
            });
        }
    };
    // For a checkpoint base, the log must still hold everything after it.
    for (p, (&from, &low)) in applier
        .partitions()
        .iter()
        .map(|s| s.next_offset)
        .collect::<Vec<_>>()
        .iter()
        .zip(&log.low_watermarks)
        .enumerate()
    {
        if from < low {
            return Err(AuditError::TooOld {
                why: format!("partition {p} would replay from offset {from} but the log starts at {low}"),
                earliest: format!("log start offsets {:?}", log.low_watermarks),
            });
        }
    }
    let replayed = replay(&mut applier, log, point, target.as_deref(), progress)?;
    Ok(Reconstructed { applier, checkpoint, replayed })
}

/// Applies records from the applier's current offsets up to `point` (for walking forward from
/// one reconstructed point to a later one).
pub fn advance(
    applier: &mut Applier,
    log: &LogSource,
    point: &Point,
    progress: bool,
) -> Result<u64, AuditError> {
    let target = target_offsets(point, log)?;
    replay(applier, log, point, target.as_deref(), progress)
}

/// Applies records from the applier's offsets up to the point.
fn replay(
    applier: &mut Applier,
    log: &LogSource,
    point: &Point,
    target: Option<&[i64]>,
    progress: bool,
) -> Result<u64, AuditError> {
    let ends: Vec<i64> = match target {
        Some(t) => t.to_vec(),
        None => log.high_watermarks.clone(),
    };
    let mut open: Vec<bool> =
        (0..log.partitions as usize).map(|p| applier.partition(p as u32).next_offset < ends[p]).collect();
    let total: i64 = (0..log.partitions as usize)
        .map(|p| (ends[p] - applier.partition(p as u32).next_offset).max(0))
        .sum();
    let bar = if progress { ProgressBar::new(total as u64) } else { ProgressBar::hidden() };
    bar.set_style(
        ProgressStyle::with_template("replaying {bar:40} {pos}/{len} records ({per_sec}, eta {eta})")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    if !open.iter().any(|&o| o) {
        return Ok(0);
    }
    let mut cc = ClientConfig::new();
    cc.set("bootstrap.servers", &log.brokers)
        .set("group.id", "prefixlog-audit-unused")
        .set("enable.auto.commit", "false")
        .set("fetch.wait.max.ms", "10");
    for (k, v) in &log.properties {
        cc.set(k, v);
    }
    let consumer: BaseConsumer = cc.create()?;
    let mut tpl = TopicPartitionList::new();
    for (p, &o) in open.iter().enumerate() {
        if o {
            tpl.add_partition_offset(
                &log.topic,
                p as i32,
                Offset::Offset(applier.partition(p as u32).next_offset),
            )?;
        }
    }
    consumer.assign(&tpl)?;
    let mut n = 0u64;
    let mut idle = 0;
    while open.iter().any(|&o| o) {
        let Some(m) = consumer.poll(Duration::from_millis(200)) else {
            idle += 1;
            if idle > 150 {
                break; // 30 s without a record: the broker is gone; report what we have
            }
            continue;
        };
        idle = 0;
        let m = m?;
        let p = m.partition() as usize;
        if !open[p] {
            continue;
        }
        let ts = m.timestamp().to_millis().unwrap_or(0).max(0) as u64;
        let stop = m.offset() >= ends[p] || matches!(point, Point::Time(t) if ts > *t);
        if stop {
            open[p] = false;
            continue;
        }
        applier.apply(p as u32, m.offset(), ts, m.payload());
        n += 1;
        bar.inc(1);
        if m.offset() + 1 >= ends[p] {
            open[p] = false;
        }
    }
    bar.finish_and_clear();
    Ok(n)
}
