//! The LMCache bridge's loop: read every partition of LMCache's cache-event topic from its
//! start (manual assignment, nothing committed), translate ([`super::translate`]) and
//! publish each record before reading the next, so a partition's records land in order.
//!
//! At start the records already in the topic (below each partition's high watermark) are read
//! twice: first for each instance's newest incarnation ([`newest_incarnations`]), then
//! translated from the start, publishing only those instances' newest incarnation
//! ([`is_current`]). Everything after is published as it comes.

use super::metrics::LmMetrics;
use super::translate::{is_current, newest_incarnations, Output, Translator};
use prefixlog_ingest::Publisher;
use prefixlog_state::record::{KvBatch, Lifecycle};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use std::collections::BTreeMap;
use std::time::Duration;
use tokio::sync::watch;

/// Where LMCache's sink writes.
#[derive(Clone, Debug)]
pub struct Source {
    /// A consumer's settings (`bootstrap.servers` and any security properties).
    pub config: ClientConfig,
    pub topic: String,
    /// How long to wait for the topic to exist at start before failing.
    pub wait_for_topic: Duration,
}

/// Errors that stop the bridge.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("LMCache topic {topic:?}: {source}")]
    Kafka { topic: String, source: rdkafka::error::KafkaError },
    #[error("LMCache topic {topic:?} has no partitions after {waited:?} (is the sink's topic name right?)")]
    NoTopic { topic: String, waited: Duration },
}

/// Reads and translates until `stop` turns true; returns the translator (its counters).
pub async fn run(
    source: Source,
    mut translator: Translator,
    publisher: Publisher,
    mut stop: watch::Receiver<bool>,
) -> Result<Translator, RunError> {
    let err = |e| RunError::Kafka { topic: source.topic.clone(), source: e };
    let mut cfg = source.config.clone();
    cfg.set("group.id", "prefixlog-lmcache-bridge-unused")
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest");
    let consumer: StreamConsumer = cfg.create().map_err(err)?;
    let Some(partitions) = wait_for_partitions(&consumer, &source, &mut stop).await? else {
        return Ok(translator);
    };
    let (mut starts, mut ends) = (Vec::new(), Vec::new());
    for p in 0..partitions as i32 {
        let (low, high) =
            consumer.fetch_watermarks(&source.topic, p, Duration::from_secs(10)).map_err(err)?;
        starts.push(low);
        ends.push(high);
    }
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(&source.topic, p as i32, Offset::Beginning).map_err(err)?;
    }
    let newest = catch_up(&consumer, &tpl, &starts, &ends, &mut stop).await.map_err(err)?;
    for (p, _) in starts.iter().enumerate().filter(|(_, &s)| s > 0) {
        tracing::warn!(topic = %source.topic, partition = p, start = starts[p], "lmcache bridge: the topic no longer starts at offset 0: each of its instances is cleared through the log on its first batch after the catch-up and starts over (an earlier run may have credited chunks this one never read)");
    }
    let mut marks = std::collections::BTreeSet::new();
    consumer.assign(&tpl).map_err(err)?;
    tracing::info!(topic = %source.topic, partitions, instances = newest.len(), "lmcache bridge: reading from the start");
    loop {
        tokio::select! {
            _ = stop.changed() => break,
            m = consumer.recv() => match m {
                Ok(m) => {
                    let value = m.payload().unwrap_or_default().to_vec();
                    let at = (m.partition(), m.offset());
                    let before_start = ends.get(at.0 as usize).is_some_and(|&end| at.1 < end);
                    drop(m);
                    let truncated = starts.get(at.0 as usize).is_some_and(|&s| s > 0);
                    let ctx = Ctx { newest: before_start.then_some(&newest), truncated, marks: &mut marks };
                    handle(&mut translator, &publisher, &value, at, ctx).await;
                }
                Err(e) => {
                    tracing::warn!(topic = %source.topic, error = %e, "lmcache bridge: consumer error");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
    }
    if let Err(e) = publisher.flush(Duration::from_secs(10)) {
        tracing::warn!(error = %e, "lmcache bridge: records still queued at shutdown");
    }
    Ok(translator)
}

/// Reads every partition from `starts` up to `ends` (its watermarks at start) and returns
/// each instance's newest incarnation there.
async fn catch_up(
    consumer: &StreamConsumer,
    tpl: &TopicPartitionList,
    starts: &[i64],
    ends: &[i64],
    stop: &mut watch::Receiver<bool>,
) -> Result<BTreeMap<String, u64>, rdkafka::error::KafkaError> {
    let mut left: Vec<bool> = starts.iter().zip(ends).map(|(s, e)| s < e).collect();
    let mut values: Vec<Vec<u8>> = Vec::new();
    let mut newest = BTreeMap::new();
    consumer.assign(tpl)?;
    while left.iter().any(|&l| l) {
        let m = tokio::select! {
            _ = stop.changed() => break,
            m = consumer.recv() => m?,
        };
        let (p, o) = (m.partition() as usize, m.offset());
        if p < ends.len() && o < ends[p] {
            values.push(m.payload().unwrap_or_default().to_vec());
        }
        if p < ends.len() && o + 1 >= ends[p] {
            left[p] = false;
        }
        if values.len() >= 1024 {
            merge_newest(&mut newest, newest_incarnations(values.iter().map(|v| &v[..])));
            values.clear();
        }
    }
    merge_newest(&mut newest, newest_incarnations(values.iter().map(|v| &v[..])));
    Ok(newest)
}

fn merge_newest(into: &mut BTreeMap<String, u64>, from: BTreeMap<String, u64>) {
    for (k, v) in from {
        let e = into.entry(k).or_insert(v);
        *e = (*e).max(v);
    }
}

/// The topic's partition count, once it exists (LMCache's producer may create it later);
/// `None` when stopped first.
async fn wait_for_partitions(
    consumer: &StreamConsumer,
    source: &Source,
    stop: &mut watch::Receiver<bool>,
) -> Result<Option<u32>, RunError> {
    let start = std::time::Instant::now();
    let mut warned = false;
    loop {
        let md = consumer.fetch_metadata(Some(&source.topic), Duration::from_secs(5));
        let n = md.as_ref().ok().and_then(|md| md.topics().first().map(|t| t.partitions().len() as u32));
        match n {
            Some(n) if n > 0 => return Ok(Some(n)),
            _ if start.elapsed() >= source.wait_for_topic => {
                return Err(RunError::NoTopic { topic: source.topic.clone(), waited: source.wait_for_topic })
            }
            _ => {
                if !warned {
                    tracing::warn!(topic = %source.topic, "lmcache bridge: topic not there yet, waiting");
                    warned = true;
                }
                tokio::select! {
                    _ = stop.changed() => return Ok(None),
                    _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                }
            }
        }
    }
}

/// Translates one LMCache record and publishes what it asks for, in order.
/// How one record is published.
struct Ctx<'a> {
    /// While catching up: only records of these incarnations (and later) are published.
    newest: Option<&'a BTreeMap<String, u64>>,
    /// The record's partition no longer starts at offset 0: the bridge's state of its
    /// instances may lack chunks an earlier bridge published (a delete of one would publish
    /// nothing), so each instance met during the catch-up starts over on its first batch after
    /// it (`marks`: instances met; [`Translator::start_over`]).
    truncated: bool,
    marks: &'a mut std::collections::BTreeSet<(i32, String)>,
}

async fn handle(t: &mut Translator, publisher: &Publisher, value: &[u8], at: (i32, i64), ctx: Ctx<'_>) {
    if ctx.newest.is_none() {
        // This partition is caught up: every instance met in its catch-up starts over on its
        // next batch (an instance's batches are all in one partition, keyed by its id).
        let met: Vec<(i32, String)> = ctx.marks.iter().filter(|(p, _)| *p == at.0).cloned().collect();
        for m in met {
            t.start_over(&m.1);
            ctx.marks.remove(&m);
        }
    }
    match t.offer_record(value) {
        Ok(outputs) => {
            for mut o in outputs {
                if ctx.newest.is_some_and(|n| !is_current(&o, n)) {
                    o.records.clear();
                }
                if ctx.truncated && ctx.newest.is_some() {
                    ctx.marks.insert((at.0, o.instance.clone()));
                }
                publish(t.metrics(), publisher, o).await;
            }
        }
        Err(e) => {
            tracing::warn!(partition = at.0, offset = at.1, error = %e, "lmcache bridge: record refused (LMCache's consumer drops it too)")
        }
    }
}

async fn publish(m: &LmMetrics, publisher: &Publisher, o: Output) {
    if let Some((worker, metadata)) = o.announce {
        if let Err(e) = publisher.publish_lifecycle(worker, &Lifecycle::Added { metadata }).await {
            tracing::error!(worker, error = %e, "lmcache bridge: worker-added not published");
        }
    }
    for r in o.records {
        let batch = KvBatch {
            keyspace: &r.keyspace,
            worker: r.worker,
            dp_rank: 0,
            epoch: r.epoch,
            seq: r.seq,
            gap_before: r.gap_before,
            events: &r.ops,
            lanes: &[],
        };
        match publisher.publish_kv_batch(&batch, None).await {
            Ok(_) => LmMetrics::inc(&m.published, "published"),
            Err(e) => {
                // Later records still land: replicas see the missing seq as a gap.
                LmMetrics::inc(&m.published, "publish_failed");
                tracing::error!(worker = r.worker, seq = r.seq, error = %e, "lmcache bridge: publish failed");
            }
        }
    }
}
