//! Prometheus metrics of a replica: query latency and outcomes (recorded per request) and the
//! replica's progress and state size (read from `ReplicaStatus`, the applier and the engine at
//! scrape time, so the ingest path pays nothing for them).

use parking_lot::Mutex;
use prefixlog_engine::Engine;
use prefixlog_ingest::{Applier, ReplicaStatus};
use prometheus::{
    Encoder, Histogram, HistogramOpts, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// Per-request metrics, shared by the gRPC service.
pub struct QueryMetrics {
    latency: Histogram,
    by_code: IntCounterVec,
}

impl QueryMetrics {
    fn new(r: &Registry) -> prometheus::Result<Self> {
        // 10 µs .. ~1.3 s, doubling: a query is tens of µs, a consistency wait up to the deadline.
        let buckets = prometheus::exponential_buckets(10e-6, 2.0, 18)?;
        let latency = Histogram::with_opts(
            HistogramOpts::new(
                "prefixlog_query_latency_seconds",
                "Server-side Match latency (validation, consistency wait, match), per request",
            )
            .buckets(buckets),
        )?;
        let by_code = IntCounterVec::new(
            Opts::new("prefixlog_queries_total", "Match requests by gRPC status code"),
            &["code"],
        )?;
        r.register(Box::new(latency.clone()))?;
        r.register(Box::new(by_code.clone()))?;
        Ok(Self { latency, by_code })
    }

    pub fn observe(&self, d: Duration, err: Option<tonic::Code>) {
        self.latency.observe(d.as_secs_f64());
        let code = err.map_or("Ok".to_string(), |c| format!("{c:?}"));
        self.by_code.with_label_values(&[code.as_str()]).inc();
    }
}

/// Everything `/metrics` reports.
pub struct Metrics {
    registry: Registry,
    pub query: Arc<QueryMetrics>,
    engine: Arc<Engine>,
    status: Arc<ReplicaStatus>,
    applier: Option<Arc<Mutex<Applier>>>,
    gauges: ScrapeGauges,
}

struct ScrapeGauges {
    next_offset: IntGaugeVec,
    high_watermark: IntGaugeVec,
    lag: IntGaugeVec,
    log_time: IntGaugeVec,
    records_applied: IntGauge,
    records_skipped: IntGauge,
    skipped_by_reason: IntGaugeVec,
    keyspaces: IntGauge,
    holders: IntGauge,
    holder_blocks: IntGauge,
    engine_heap_bytes: IntGauge,
    rss_bytes: IntGauge,
    broker_ok: IntGauge,
}

impl Metrics {
    /// `applier` (optional) adds per-reason skip counts; reading it takes the applier's lock
    /// once per scrape.
    pub fn new(
        engine: Arc<Engine>,
        status: Arc<ReplicaStatus>,
        applier: Option<Arc<Mutex<Applier>>>,
    ) -> prometheus::Result<Self> {
        let registry = Registry::new();
        let query = Arc::new(QueryMetrics::new(&registry)?);
        let gv = |name: &str, help: &str| -> prometheus::Result<IntGaugeVec> {
            let g = IntGaugeVec::new(Opts::new(name, help), &["partition"])?;
            registry.register(Box::new(g.clone()))?;
            Ok(g)
        };
        let g = |name: &str, help: &str| -> prometheus::Result<IntGauge> {
            let g = IntGauge::new(name, help)?;
            registry.register(Box::new(g.clone()))?;
            Ok(g)
        };
        let skipped_by_reason = IntGaugeVec::new(
            Opts::new("prefixlog_records_skipped_by_reason", "Records skipped, by reason (from the applier)"),
            &["reason"],
        )?;
        registry.register(Box::new(skipped_by_reason.clone()))?;
        let gauges = ScrapeGauges {
            next_offset: gv("prefixlog_partition_next_offset", "Next offset to apply, per partition")?,
            high_watermark: gv("prefixlog_partition_high_watermark", "Broker high watermark, per partition")?,
            lag: gv("prefixlog_partition_lag", "Records behind the high watermark, per partition")?,
            log_time: gv(
                "prefixlog_partition_log_time_ms",
                "Log time (max record timestamp), per partition",
            )?,
            records_applied: g("prefixlog_records_applied", "Records applied since start")?,
            records_skipped: g("prefixlog_records_skipped", "Records skipped since start (all reasons)")?,
            skipped_by_reason,
            keyspaces: g("prefixlog_keyspaces", "Keyspaces in the engine")?,
            holders: g("prefixlog_holders", "Holders (worker, dp rank, lane) over all keyspaces")?,
            holder_blocks: g("prefixlog_holder_blocks", "Resident (holder, block) pairs")?,
            engine_heap_bytes: g("prefixlog_engine_heap_bytes", "Engine heap bytes (estimate)")?,
            rss_bytes: g("prefixlog_process_resident_bytes", "Process resident memory")?,
            broker_ok: g("prefixlog_broker_ok", "1 while the broker is reachable")?,
        };
        Ok(Self { registry, query, engine, status, applier, gauges })
    }

    /// The text exposition, with scrape-time gauges refreshed. Also includes prometheus'
    /// default registry, where other subsystems of the process (anti-entropy, the bridge)
    /// register their collectors.
    pub fn render(&self) -> String {
        self.refresh();
        let mut buf = Vec::new();
        let mut families = self.registry.gather();
        families.extend(prometheus::gather());
        let _ = TextEncoder::new().encode(&families, &mut buf);
        String::from_utf8(buf).unwrap_or_default()
    }

    fn refresh(&self) {
        let g = &self.gauges;
        for (p, s) in self.status.partitions.iter().enumerate() {
            let l = [p.to_string()];
            let (next, high) =
                (s.next_offset.load(Ordering::Acquire), s.high_watermark.load(Ordering::Acquire));
            g.next_offset.with_label_values(&l).set(next);
            g.high_watermark.with_label_values(&l).set(high);
            g.lag.with_label_values(&l).set((high - next).max(0));
            g.log_time.with_label_values(&l).set(s.log_time.load(Ordering::Acquire) as i64);
        }
        g.records_applied.set(self.status.records_applied.load(Ordering::Relaxed) as i64);
        g.records_skipped.set(self.status.records_skipped.load(Ordering::Relaxed) as i64);
        g.broker_ok.set(i64::from(self.status.broker_ok.load(Ordering::Relaxed)));
        if let Some(a) = &self.applier {
            let mut by: std::collections::BTreeMap<&'static str, u64> = Default::default();
            let a = a.lock();
            for p in a.partitions() {
                let c = &p.counters;
                *by.entry("duplicate").or_default() += c.duplicates;
                *by.entry("stale_epoch").or_default() += c.stale_epochs;
                for (r, n) in &c.bad {
                    *by.entry(r.as_str()).or_default() += n;
                }
            }
            drop(a);
            for (r, n) in by {
                g.skipped_by_reason.with_label_values(&[r]).set(n as i64);
            }
        }
        let kss = self.engine.keyspaces();
        g.keyspaces.set(kss.len() as i64);
        let (mut holders, mut blocks, mut heap) = (0i64, 0i64, 0i64);
        for k in kss {
            let k = k.read();
            holders += k.holder_count() as i64;
            blocks += k.holder_blocks() as i64;
            heap += k.heap_bytes() as i64;
        }
        g.holders.set(holders);
        g.holder_blocks.set(blocks);
        g.engine_heap_bytes.set(heap);
        g.rss_bytes.set(rss_bytes());
    }
}

fn rss_bytes() -> i64 {
    // statm's second field is resident pages; 4 KiB pages on the platforms we run on.
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1).and_then(|v| v.parse::<i64>().ok()))
        .map_or(0, |pages| pages * 4096)
}
