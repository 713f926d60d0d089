//! An in-memory log (feature `testing`, tests only): [`MemoryLog`] implements [`LogSource`] and
//! [`LogAppend`] over per-partition vectors, and [`MemoryReplica`] implements [`LiveState`]
//! over an applier nobody else writes. Tests of the layers above the Kafka edge (repairs,
//! audits, facades) run on it without a broker; the Kafka edge's own tests use the embedded
//! broker.

use crate::log::{
    Appending, ApplyLogOptions, BeforeApply, LiveState, LogError, LogProbe, LogSource, OnRecord, Replacing,
    Until, Watermarks,
};
use crate::{Applier, Landed, LogAppend, NotNext, StateSettings};
use parking_lot::Mutex;
use prefixlog_engine::{partition_of, LogTime};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Why [`MemoryLog::apply`] did not reach its target.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum MemoryLogError {
    #[error("partition {partition}: asked to apply up to {asked}, the log ends at {end}")]
    BeyondEnd { partition: u32, asked: i64, end: i64 },
    #[error("partition {partition}: asked to apply up to {asked}, the state is already at {at}")]
    Behind { partition: u32, asked: i64, at: i64 },
    #[error("partition {partition}: the state is at {at}, the log starts at {low}")]
    NotContinued { partition: u32, at: i64, low: i64 },
    #[error(transparent)]
    NotNext(#[from] NotNext),
}

#[derive(Default)]
struct Partition {
    /// (log time, record) at offset `low + i`.
    records: Vec<(LogTime, Vec<u8>)>,
    /// The first retained offset (retention moved it past the records dropped).
    low: i64,
}

/// A log of `partitions` partitions, all owned, in memory.
pub struct MemoryLog {
    partitions: u32,
    owned: Vec<u32>,
    settings: StateSettings,
    log: Mutex<Vec<Partition>>,
}

impl MemoryLog {
    pub fn new(partitions: u32, settings: StateSettings) -> Self {
        let log = (0..partitions).map(|_| Partition::default()).collect();
        Self { partitions, owned: (0..partitions).collect(), settings, log: Mutex::new(log) }
    }

    /// Appends `record` for `worker` at log time `log_time` (ms).
    pub fn push(&self, worker: u64, log_time: LogTime, record: Vec<u8>) -> Landed {
        let partition = partition_of(worker, self.partitions);
        let mut log = self.log.lock();
        let part = &mut log[partition as usize];
        part.records.push((log_time, record));
        Landed { partition, offset: part.low + part.records.len() as i64 - 1 }
    }

    /// Retention: drops partition `p`'s records below `offset`.
    pub fn drop_before(&self, p: u32, offset: i64) {
        let mut log = self.log.lock();
        let part = &mut log[p as usize];
        let n = (offset - part.low).clamp(0, part.records.len() as i64) as usize;
        part.records.drain(..n);
        part.low += n as i64;
    }

    /// Partition `p`'s retained records as `(offset, log time, value)`, in offset order (for
    /// tests' reference models).
    pub fn records_of(&self, p: u32) -> Vec<(i64, LogTime, Vec<u8>)> {
        let log = self.log.lock();
        let part = &log[p as usize];
        part.records.iter().enumerate().map(|(i, (t, v))| (part.low + i as i64, *t, v.clone())).collect()
    }

    /// The next offset of every partition.
    pub fn ends(&self) -> Vec<i64> {
        self.log.lock().iter().map(|p| p.low + p.records.len() as i64).collect()
    }

    fn targets(&self, at: &dyn Fn(u32) -> i64, until: &Until) -> Result<BTreeMap<u32, i64>, MemoryLogError> {
        let ends = self.ends();
        let mut out = BTreeMap::new();
        match until {
            Until::Offsets(o) => {
                for (&partition, &asked) in o {
                    let (end, at) = (ends[partition as usize], at(partition));
                    if asked > end {
                        return Err(MemoryLogError::BeyondEnd { partition, asked, end });
                    }
                    if asked < at {
                        return Err(MemoryLogError::Behind { partition, asked, at });
                    }
                    out.insert(partition, asked);
                }
            }
            Until::Time(_) => out.extend(self.owned.iter().map(|&p| (p, ends[p as usize]))),
        }
        Ok(out)
    }

    fn apply_all(
        &self,
        applier: &mut Applier,
        until: &Until,
        mut before_apply: Option<&mut BeforeApply<'_>>,
    ) -> Result<u64, MemoryLogError> {
        let targets = self.targets(&|p| applier.partition(p).next_offset, until)?;
        let spans = targets.into_iter().map(|(p, end)| (p, applier.partition(p).next_offset, end)).collect();
        self.walk(spans, until, &mut |partition, offset, log_time, record| {
            if let Some(f) = before_apply.as_mut() {
                f(applier, partition, offset, log_time, Some(record));
            }
            applier.apply(partition, offset, log_time, Some(record))?;
            Ok(())
        })
    }

    fn read_all(
        &self,
        from: &BTreeMap<u32, i64>,
        until: &Until,
        on_record: &mut OnRecord<'_>,
    ) -> Result<u64, MemoryLogError> {
        // Partitions not in `from` are not read (nor checked).
        let at = |p: u32| from.get(&p).copied().unwrap_or(0);
        let spans = (self.targets(&at, until)?.into_iter())
            .filter(|(p, _)| from.contains_key(p))
            .map(|(p, end)| (p, at(p), end))
            .collect();
        self.walk(spans, until, &mut |partition, offset, log_time, record| {
            on_record(partition, offset, log_time, Some(record));
            Ok(())
        })
    }

    /// Visits every record of each (partition, from, end) span in offset order, stopping a
    /// partition at `until`'s time; a span starting below the partition's retained start is
    /// refused. Returns the records visited.
    fn walk(
        &self,
        spans: Vec<(u32, i64, i64)>,
        until: &Until,
        visit: &mut VisitRecord<'_>,
    ) -> Result<u64, MemoryLogError> {
        let log = self.log.lock();
        let mut visited = 0;
        for (partition, at, end) in spans {
            let part = &log[partition as usize];
            if at < part.low && at < end {
                return Err(MemoryLogError::NotContinued { partition, at, low: part.low });
            }
            for offset in at..end {
                let (log_time, record) = &part.records[(offset - part.low) as usize];
                if matches!(until, Until::Time(t) if log_time > t) {
                    break;
                }
                visit(partition, offset, *log_time, record)?;
                visited += 1;
            }
        }
        Ok(visited)
    }
}

/// What [`MemoryLog::walk`] calls with each record: (partition, offset, log time, value).
type VisitRecord<'a> = dyn FnMut(u32, i64, u64, &[u8]) -> Result<(), MemoryLogError> + 'a;

impl LogSource for MemoryLog {
    fn topic(&self) -> &str {
        "memory"
    }

    fn partitions(&self) -> u32 {
        self.partitions
    }

    fn owned(&self) -> &[u32] {
        &self.owned
    }

    fn settings(&self) -> StateSettings {
        self.settings
    }

    fn probe(&self) -> Result<LogProbe, LogError> {
        let log = self.log.lock();
        let watermarks = (0..self.partitions)
            .map(|p| {
                let part = &log[p as usize];
                (p, Watermarks { low: part.low, high: part.low + part.records.len() as i64 })
            })
            .collect();
        Ok(LogProbe { cluster_id: "memory".into(), partitions: self.partitions, watermarks })
    }

    fn apply(
        &self,
        applier: &mut Applier,
        until: &Until,
        opts: ApplyLogOptions<'_>,
    ) -> Result<u64, LogError> {
        self.apply_all(applier, until, opts.before_apply).map_err(LogError::new)
    }

    fn read(
        &self,
        from: &BTreeMap<u32, i64>,
        until: &Until,
        _probe: Option<&LogProbe>,
        on_record: &mut OnRecord<'_>,
    ) -> Result<u64, LogError> {
        self.read_all(from, until, on_record).map_err(LogError::new)
    }
}

impl LogAppend for MemoryLog {
    fn append(&self, worker: u64, record: Vec<u8>) -> Appending<'_> {
        let landed = self.push(worker, 1, record);
        Box::pin(std::future::ready(Ok(landed)))
    }
}

/// A replica whose applier only the test writes: partition swaps happen at once.
pub struct MemoryReplica {
    applier: Arc<Mutex<Applier>>,
}

impl MemoryReplica {
    pub fn new(applier: Applier) -> Self {
        Self { applier: Arc::new(Mutex::new(applier)) }
    }
}

impl LiveState for MemoryReplica {
    fn applier(&self) -> &Arc<Mutex<Applier>> {
        &self.applier
    }

    fn replace_partition(&self, partition: u32, src: Applier) -> Replacing<'_> {
        self.applier.lock().replace_partition(partition, &src);
        Box::pin(std::future::ready(Ok(())))
    }
}
