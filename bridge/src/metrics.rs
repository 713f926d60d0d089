//! The bridge's metrics: plain atomic counters and a publish-latency histogram per engine
//! stream ([`BridgeMetrics`]); [`BridgeMetrics::snapshot`] reads the counters at once (the
//! bridge logs that periodically), and [`BridgeCollector`] exports every stream's metrics to a
//! Prometheus registry as `prefixlog_bridge_<family>_total{worker,endpoint[,reason|outcome]}`
//! (the families: [`EXPORTED`]) and `prefixlog_bridge_publish_latency_seconds{worker,endpoint}`.

use parking_lot::Mutex;
use prometheus::core::{Collector, Desc};
use prometheus::proto::{LabelPair, MetricFamily};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

pub use crate::zmtp::Ending;

/// Why a decoded event was not published.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Refusal {
    /// Token count is not `hashes × keyspace block size` (or the event's block size differs).
    TokenCount,
    /// Token ids not representable as u32 (negative, too large, lists other than overlapping
    /// bigram pairs).
    Tokens,
    /// The parent's local hash is unknown to the bridge (stored before it started, or lost in a
    /// gap): the blocks cannot be hashed canonically.
    UnknownParent,
    /// A storage medium other than the GPU cache (offload tiers are not indexed).
    Medium,
    /// A known event type with a missing or mistyped field.
    Malformed,
    /// A LoRA adapter given only by integer id (older vLLM): no name a gateway could hash
    /// with, and the same tokens are a different cache entry, so indexing it could credit
    /// blocks the worker does not hold. (Adapters given by name are indexed under their own
    /// namespace.)
    Namespaced,
    /// `extra_keys` a gateway cannot reproduce from documented inputs: prompt-embeds hashes
    /// (bytes), elements of an unknown shape, a list not one entry per block, or LoRA keys that
    /// do not match the event's `lora_name`. (LoRA names, multimodal identifiers and the cache
    /// salt are indexed: `scheme::block_hashes_with`.)
    ExtraKeys,
    /// `lookahead_token_ids` that are not one token list per block, all as long (a gateway asks
    /// with one lookahead count).
    Lookahead,
    /// A top-level `cache_salt` (SGLang) that is not a string, or differs from the salt its
    /// parent block was stored under.
    Salt,
    /// Blocks that are not the worker's own primary copy: vLLM's `locality` other than `LOCAL`
    /// (a remote store relative to the publisher) or an `ownership` (a secondary offloading
    /// tier). Their removals are skipped too (counted here): the bridge never credited them.
    Residency,
    /// A field this bridge does not know, with a value: it may change what the block is.
    UnknownField,
    /// Block keys the keyspace's hash scheme cannot carry: under scheme 2 (Dynamo's
    /// position-free hash) any key besides the LoRA name (multimodal identifiers, the cache
    /// salt, prompt-embeds digests). Hashing the tokens alone would credit the block to
    /// prompts without those inputs.
    SchemeKeys,
}

impl Refusal {
    pub const ALL: [Refusal; 12] = [
        Refusal::TokenCount,
        Refusal::Tokens,
        Refusal::UnknownParent,
        Refusal::Medium,
        Refusal::Malformed,
        Refusal::Namespaced,
        Refusal::ExtraKeys,
        Refusal::Lookahead,
        Refusal::Salt,
        Refusal::Residency,
        Refusal::UnknownField,
        Refusal::SchemeKeys,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::TokenCount => "token_count",
            Refusal::Tokens => "tokens",
            Refusal::UnknownParent => "unknown_parent",
            Refusal::Medium => "medium",
            Refusal::Malformed => "malformed",
            Refusal::Namespaced => "namespaced",
            Refusal::ExtraKeys => "extra_keys",
            Refusal::Lookahead => "lookahead",
            Refusal::Salt => "cache_salt",
            Refusal::Residency => "residency",
            Refusal::UnknownField => "unknown_field",
            Refusal::SchemeKeys => "scheme_keys",
        }
    }
}

#[derive(Debug)]
pub struct BridgeMetrics {
    /// ZeroMQ messages received (live and replayed).
    pub messages_received: AtomicU64,
    /// Messages that could not be decoded at all (bad frames, not msgpack, not a batch).
    pub messages_undecodable: AtomicU64,
    /// Messages skipped as duplicates (same seq and payload already handled).
    pub messages_duplicate: AtomicU64,
    /// Messages over `--max-frame-bytes` (a frame, the message, or more frames than a message
    /// may have): the connection was dropped before anything was reserved for it.
    pub messages_oversized: AtomicU64,
    /// Events inside decoded batches.
    pub events_received: AtomicU64,
    /// Events translated and published.
    pub events_published: AtomicU64,
    /// Events of a type this build does not know (ignored).
    pub events_unknown_type: AtomicU64,
    /// Unknown fields ignored (batch and event level).
    pub fields_ignored: AtomicU64,
    pub refused_token_count: AtomicU64,
    pub refused_tokens: AtomicU64,
    pub refused_unknown_parent: AtomicU64,
    pub refused_medium: AtomicU64,
    pub refused_malformed: AtomicU64,
    pub refused_namespaced: AtomicU64,
    pub refused_extra_keys: AtomicU64,
    pub refused_lookahead: AtomicU64,
    pub refused_salt: AtomicU64,
    pub refused_residency: AtomicU64,
    pub refused_unknown_field: AtomicU64,
    pub refused_scheme_keys: AtomicU64,
    /// Sequence gaps detected.
    pub gaps: AtomicU64,
    /// Gaps replay could not fill (no replay socket, a failed replay, a buffer that does not
    /// reach back): the worker's state was cleared through the log (a new epoch).
    pub resets_gap: AtomicU64,
    /// Messages whose events could not all be read (undecodable, an unknown event type, a
    /// malformed event — any might have been a removal): the worker's state was cleared.
    pub resets_lost: AtomicU64,
    /// Replay requests answered (end marker received).
    pub replays_ok: AtomicU64,
    /// Replay requests that failed or timed out.
    pub replays_failed: AtomicU64,
    /// Replay requests whose answer went over `--max-replay-bytes` or a frame cap.
    pub replays_oversized: AtomicU64,
    /// Batches recovered through replay.
    pub replayed_batches: AtomicU64,
    /// Replay requests made because the stream went quiet ([`crate::BridgeOptions::tail_probe`]).
    pub tail_probes: AtomicU64,
    /// Quiet-stream probes that found messages lost after the last one received.
    pub tails_recovered: AtomicU64,
    /// New epochs started (engine restarts).
    pub epochs: AtomicU64,
    /// Subscriber reconnects (idle or error).
    pub reconnects: AtomicU64,
    /// Subscriber connections that ended, by why ([`Ending`]).
    pub disconnects_oversized: AtomicU64,
    pub disconnects_protocol: AtomicU64,
    pub disconnects_timeout: AtomicU64,
    pub disconnects_closed: AtomicU64,
    /// Records published.
    pub batches_published: AtomicU64,
    /// Records carrying more blocks than replicas accept by default (they will skip them).
    pub batches_oversized: AtomicU64,
    /// Batches not published because another engine stream of this bridge writes their feed
    /// (same worker and resolved dp rank).
    pub batches_feed_taken: AtomicU64,
    pub publish_errors: AtomicU64,
    /// Publish latency (enqueue → broker acknowledgement), seconds.
    pub publish_latency: prometheus::Histogram,
}

impl Default for BridgeMetrics {
    fn default() -> Self {
        let z = || AtomicU64::new(0);
        Self {
            messages_received: z(),
            messages_undecodable: z(),
            messages_duplicate: z(),
            messages_oversized: z(),
            events_received: z(),
            events_published: z(),
            events_unknown_type: z(),
            fields_ignored: z(),
            refused_token_count: z(),
            refused_tokens: z(),
            refused_unknown_parent: z(),
            refused_medium: z(),
            refused_malformed: z(),
            refused_namespaced: z(),
            refused_extra_keys: z(),
            refused_lookahead: z(),
            refused_salt: z(),
            refused_residency: z(),
            refused_unknown_field: z(),
            refused_scheme_keys: z(),
            gaps: z(),
            resets_gap: z(),
            resets_lost: z(),
            replays_ok: z(),
            replays_failed: z(),
            replays_oversized: z(),
            replayed_batches: z(),
            tail_probes: z(),
            tails_recovered: z(),
            epochs: z(),
            reconnects: z(),
            disconnects_oversized: z(),
            disconnects_protocol: z(),
            disconnects_timeout: z(),
            disconnects_closed: z(),
            batches_published: z(),
            batches_oversized: z(),
            batches_feed_taken: z(),
            publish_errors: z(),
            publish_latency: prometheus::Histogram::with_opts(latency_opts()).expect("valid histogram"),
        }
    }
}

fn latency_opts() -> prometheus::HistogramOpts {
    // 100 µs .. ~13 s, doubling.
    let buckets = prometheus::exponential_buckets(1e-4, 2.0, 18).expect("valid buckets");
    prometheus::HistogramOpts::new(
        "prefixlog_bridge_publish_latency_seconds",
        "Publish latency of a bridge's records, enqueue to broker acknowledgement",
    )
    .buckets(buckets)
}

impl BridgeMetrics {
    /// Epochs the stream's session has moved up since it started: one per engine restart
    /// (`epochs`) and one per start-over (`resets_gap`, `resets_lost`); each of those counts
    /// exactly one move. Who runs the feed compares its records' epoch with the log's by this.
    pub fn epochs_moved(&self) -> u64 {
        let load = |c: &AtomicU64| c.load(Relaxed);
        load(&self.epochs) + load(&self.resets_gap) + load(&self.resets_lost)
    }

    pub fn refused(&self, r: Refusal) -> &AtomicU64 {
        match r {
            Refusal::TokenCount => &self.refused_token_count,
            Refusal::Tokens => &self.refused_tokens,
            Refusal::UnknownParent => &self.refused_unknown_parent,
            Refusal::Medium => &self.refused_medium,
            Refusal::Malformed => &self.refused_malformed,
            Refusal::Namespaced => &self.refused_namespaced,
            Refusal::ExtraKeys => &self.refused_extra_keys,
            Refusal::Lookahead => &self.refused_lookahead,
            Refusal::Salt => &self.refused_salt,
            Refusal::Residency => &self.refused_residency,
            Refusal::UnknownField => &self.refused_unknown_field,
            Refusal::SchemeKeys => &self.refused_scheme_keys,
        }
    }

    /// Counts a subscriber connection that ended.
    pub fn disconnected(&self, why: Ending) {
        Self::inc(match why {
            Ending::Oversized => &self.disconnects_oversized,
            Ending::Protocol => &self.disconnects_protocol,
            Ending::Timeout => &self.disconnects_timeout,
            Ending::Closed => &self.disconnects_closed,
        });
    }

    pub fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Relaxed);
    }

    pub fn inc(c: &AtomicU64) {
        c.fetch_add(1, Relaxed);
    }

    pub fn record_latency(&self, d: std::time::Duration) {
        self.publish_latency.observe(d.as_secs_f64());
    }

    /// Every counter as (name, value), for logs and exporters.
    pub fn snapshot(&self) -> Vec<(&'static str, u64)> {
        let g = |c: &AtomicU64| c.load(Relaxed);
        vec![
            ("messages_received", g(&self.messages_received)),
            ("messages_undecodable", g(&self.messages_undecodable)),
            ("messages_duplicate", g(&self.messages_duplicate)),
            ("messages_oversized", g(&self.messages_oversized)),
            ("events_received", g(&self.events_received)),
            ("events_published", g(&self.events_published)),
            ("events_unknown_type", g(&self.events_unknown_type)),
            ("fields_ignored", g(&self.fields_ignored)),
            ("refused_token_count", g(&self.refused_token_count)),
            ("refused_tokens", g(&self.refused_tokens)),
            ("refused_unknown_parent", g(&self.refused_unknown_parent)),
            ("refused_medium", g(&self.refused_medium)),
            ("refused_malformed", g(&self.refused_malformed)),
            ("refused_namespaced", g(&self.refused_namespaced)),
            ("refused_extra_keys", g(&self.refused_extra_keys)),
            ("refused_lookahead", g(&self.refused_lookahead)),
            ("refused_salt", g(&self.refused_salt)),
            ("refused_residency", g(&self.refused_residency)),
            ("refused_unknown_field", g(&self.refused_unknown_field)),
            ("refused_scheme_keys", g(&self.refused_scheme_keys)),
            ("gaps", g(&self.gaps)),
            ("resets_gap", g(&self.resets_gap)),
            ("resets_lost", g(&self.resets_lost)),
            ("replays_ok", g(&self.replays_ok)),
            ("replays_failed", g(&self.replays_failed)),
            ("replays_oversized", g(&self.replays_oversized)),
            ("replayed_batches", g(&self.replayed_batches)),
            ("tail_probes", g(&self.tail_probes)),
            ("tails_recovered", g(&self.tails_recovered)),
            ("epochs", g(&self.epochs)),
            ("reconnects", g(&self.reconnects)),
            ("disconnects_oversized", g(&self.disconnects_oversized)),
            ("disconnects_protocol", g(&self.disconnects_protocol)),
            ("disconnects_timeout", g(&self.disconnects_timeout)),
            ("disconnects_closed", g(&self.disconnects_closed)),
            ("batches_published", g(&self.batches_published)),
            ("batches_oversized", g(&self.batches_oversized)),
            ("batches_feed_taken", g(&self.batches_feed_taken)),
            ("publish_errors", g(&self.publish_errors)),
        ]
    }

    /// One counter by its snapshot name (tests).
    pub fn get(&self, name: &str) -> Option<u64> {
        self.snapshot().into_iter().find(|(n, _)| *n == name).map(|(_, v)| v)
    }
}

/// (snapshot name, family, the `(label, value)` it stands for in the family, if any).
type ExportedAs = (&'static str, &'static str, Option<(&'static str, &'static str)>);

/// How each counter of [`BridgeMetrics::snapshot`] is exported: its family (between
/// `prefixlog_bridge_` and `_total`) and, for families that split one measurement, the
/// `reason` or `outcome` label value it stands for. One measurement is one family, so
/// `sum by (reason)` and `sum without (reason)` mean something.
const EXPORTED: [ExportedAs; 39] = [
    ("messages_received", "messages_received", None),
    ("messages_undecodable", "messages_skipped", Some(("reason", "undecodable"))),
    ("messages_duplicate", "messages_skipped", Some(("reason", "duplicate"))),
    ("messages_oversized", "messages_skipped", Some(("reason", "oversized"))),
    ("events_received", "events_received", None),
    ("events_published", "events_published", None),
    ("events_unknown_type", "events_refused", Some(("reason", "unknown_type"))),
    ("fields_ignored", "fields_ignored", None),
    ("refused_token_count", "events_refused", Some(("reason", "token_count"))),
    ("refused_tokens", "events_refused", Some(("reason", "tokens"))),
    ("refused_unknown_parent", "events_refused", Some(("reason", "unknown_parent"))),
    ("refused_medium", "events_refused", Some(("reason", "medium"))),
    ("refused_malformed", "events_refused", Some(("reason", "malformed"))),
    ("refused_namespaced", "events_refused", Some(("reason", "namespaced"))),
    ("refused_extra_keys", "events_refused", Some(("reason", "extra_keys"))),
    ("refused_lookahead", "events_refused", Some(("reason", "lookahead"))),
    ("refused_salt", "events_refused", Some(("reason", "cache_salt"))),
    ("refused_residency", "events_refused", Some(("reason", "residency"))),
    ("refused_unknown_field", "events_refused", Some(("reason", "unknown_field"))),
    ("refused_scheme_keys", "events_refused", Some(("reason", "scheme_keys"))),
    ("gaps", "gaps", None),
    ("resets_gap", "resets", Some(("reason", "gap"))),
    ("resets_lost", "resets", Some(("reason", "lost"))),
    ("replays_ok", "replays", Some(("outcome", "ok"))),
    ("replays_failed", "replays", Some(("outcome", "failed"))),
    ("replays_oversized", "replays", Some(("outcome", "oversized"))),
    ("replayed_batches", "replayed_batches", None),
    ("tail_probes", "tail_probes", None),
    ("tails_recovered", "tails_recovered", None),
    ("epochs", "epochs", None),
    ("reconnects", "reconnects", None),
    ("disconnects_oversized", "disconnects", Some(("reason", "oversized"))),
    ("disconnects_protocol", "disconnects", Some(("reason", "protocol"))),
    ("disconnects_timeout", "disconnects", Some(("reason", "timeout"))),
    ("disconnects_closed", "disconnects", Some(("reason", "closed"))),
    ("batches_published", "batches", Some(("outcome", "published"))),
    ("batches_oversized", "batches_oversized", None),
    ("batches_feed_taken", "batches", Some(("outcome", "feed_taken"))),
    ("publish_errors", "batches", Some(("outcome", "publish_failed"))),
];

/// The help text of each exported family.
fn help(family: &str) -> &'static str {
    match family {
        "messages_received" => "ZeroMQ messages received from the engine (live and replayed)",
        "messages_skipped" => {
            "Messages not translated, by reason: undecodable (bad frames or payload; the worker \
             is cleared and starts over), duplicate, or oversized (over --max-frame-bytes: the \
             connection is dropped before anything is reserved, and the loss is a sequence gap)"
        }
        "events_received" => "Events inside decoded batches",
        "events_published" => "Events translated and acknowledged by the broker",
        "events_refused" => {
            "Events not indexed, by reason (unknown_type: an event type this build does not know)"
        }
        "fields_ignored" => {
            "Unknown batch and event fields (a stored event with one is refused as unknown_field)"
        }
        "gaps" => "Sequence gaps detected in the engine's stream",
        "resets" => {
            "Times the worker's state was cleared through the log (a new epoch) and the stream \
             started over, by reason: gap (replay could not fill a sequence gap) or lost (a \
             message whose events could not all be read)"
        }
        "replays" => {
            "Replay requests to the engine's replay socket, by outcome (oversized: the answer \
             went over --max-replay-bytes or a frame over --max-frame-bytes)"
        }
        "replayed_batches" => "Messages recovered through replay",
        "tail_probes" => "Replay requests made because the engine's stream went quiet (--tail-probe)",
        "tails_recovered" => "Quiet-stream probes that found messages lost after the last one received",
        "epochs" => "New epochs started (engine restarts)",
        "reconnects" => "Re-subscriptions to the engine (idle or failed subscriber)",
        "disconnects" => {
            "Subscriber connections that ended, by reason: oversized (a frame, message or command \
             over its cap), protocol (the peer broke ZMTP or refused the handshake), timeout \
             (connect, handshake, a write, or no traffic after a heartbeat), closed (by the peer, \
             refused, or a socket error)"
        }
        "batches" => {
            "Records by outcome: published (acknowledged), publish_failed, feed_taken (another \
             stream of this bridge writes the feed; not published)"
        }
        "batches_oversized" => "Published records over the replicas' default per-record block limit",
        _ => "prefixlog bridge counter",
    }
}

/// Exports every running engine stream's metrics (register one per process; the bridge adds
/// streams as it starts them).
#[derive(Default)]
pub struct BridgeCollector {
    streams: Mutex<Vec<(u64, String, Arc<BridgeMetrics>)>>,
}

impl BridgeCollector {
    pub fn add(&self, worker: u64, endpoint: &str, m: Arc<BridgeMetrics>) {
        self.streams.lock().push((worker, endpoint.to_string(), m));
    }

    /// Stops exporting a stream that ended (a replica's `/register` subscriptions come and go).
    pub fn remove(&self, worker: u64, endpoint: &str) {
        self.streams.lock().retain(|(w, e, _)| !(*w == worker && e == endpoint));
    }

    /// The metrics of `worker`'s streams added so far (all its engines', summed by the caller).
    pub fn of_worker(&self, worker: u64) -> Vec<Arc<BridgeMetrics>> {
        self.streams.lock().iter().filter(|(w, _, _)| *w == worker).map(|(_, _, m)| m.clone()).collect()
    }

    /// Registers it in `registry` (shared: the bridge keeps adding to it).
    pub fn register(self: &Arc<Self>, registry: &prometheus::Registry) -> prometheus::Result<()> {
        registry.register(Box::new(Exported(self.clone())))
    }

    /// One counter family per distinct family name of [`EXPORTED`], in its order.
    fn counters() -> Vec<(&'static str, prometheus::IntCounterVec)> {
        let mut out: Vec<(&'static str, prometheus::IntCounterVec)> = Vec::new();
        for (_, family, label) in EXPORTED {
            if out.iter().any(|(f, _)| *f == family) {
                continue;
            }
            let opts = prometheus::Opts::new(format!("prefixlog_bridge_{family}_total"), help(family));
            let mut labels = vec!["worker", "endpoint"];
            labels.extend(label.map(|(name, _)| name));
            out.push((family, prometheus::IntCounterVec::new(opts, &labels).expect("valid metric")));
        }
        out
    }

    fn latency_desc() -> prometheus::HistogramVec {
        prometheus::HistogramVec::new(latency_opts(), &["worker", "endpoint"]).expect("valid metric")
    }
}

struct Exported(Arc<BridgeCollector>);

fn label(name: &str, value: &str) -> LabelPair {
    let mut l = LabelPair::default();
    l.set_name(name.to_string());
    l.set_value(value.to_string());
    l
}

impl Collector for Exported {
    fn desc(&self) -> Vec<&Desc> {
        static DESCS: std::sync::OnceLock<Vec<Desc>> = std::sync::OnceLock::new();
        DESCS
            .get_or_init(|| {
                let mut d: Vec<Desc> = BridgeCollector::counters()
                    .iter()
                    .flat_map(|(_, c)| c.desc().into_iter().cloned())
                    .collect();
                d.extend(BridgeCollector::latency_desc().desc().into_iter().cloned());
                d
            })
            .iter()
            .collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let streams = self.0.streams.lock().clone();
        let counters = BridgeCollector::counters();
        let mut latency: Option<MetricFamily> = None;
        for (w, e, m) in &streams {
            let w = w.to_string();
            for ((name, v), (exported_name, family, label)) in m.snapshot().into_iter().zip(EXPORTED) {
                debug_assert_eq!(name, exported_name, "EXPORTED follows snapshot()'s order");
                let (_, c) = counters.iter().find(|(f, _)| *f == family).expect("every family is built");
                let mut values = vec![w.as_str(), e.as_str()];
                values.extend(label.map(|(_, value)| value));
                c.with_label_values(&values).inc_by(v);
            }
            // The histogram has no labels of its own: add this stream's.
            for mut mf in m.publish_latency.collect() {
                for metric in mf.mut_metric() {
                    let mut labels = metric.take_label();
                    labels.extend([label("endpoint", e), label("worker", &w)]);
                    metric.set_label(labels);
                }
                match latency.as_mut() {
                    Some(all) => all.mut_metric().extend(mf.take_metric()),
                    None => latency = Some(mf),
                }
            }
        }
        let mut out: Vec<MetricFamily> = counters.iter().flat_map(|(_, c)| c.collect()).collect();
        out.extend(latency);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_counter_is_exported_once_under_its_family() {
        let names: Vec<&str> = BridgeMetrics::default().snapshot().into_iter().map(|(n, _)| n).collect();
        let exported: Vec<&str> = EXPORTED.iter().map(|(n, _, _)| *n).collect();
        assert_eq!(names, exported);
        // A family is either one counter, or every member carries the same label name.
        for (_, family, label) in EXPORTED {
            let members: Vec<_> = EXPORTED.iter().filter(|(_, f, _)| *f == family).collect();
            let label_names: std::collections::BTreeSet<_> =
                members.iter().map(|(_, _, l)| l.map(|l| l.0)).collect();
            assert_eq!(label_names.len(), 1, "{family}: mixed labels");
            assert!(members.len() == 1 || label.is_some(), "{family}: several counters, no label");
            assert_ne!(help(family), "prefixlog bridge counter", "{family} has no help text");
        }
    }

    #[test]
    fn streams_export_labelled_families() {
        let collector = Arc::new(BridgeCollector::default());
        let registry = prometheus::Registry::new();
        collector.register(&registry).unwrap();
        let m = Arc::new(BridgeMetrics::default());
        BridgeMetrics::add(&m.refused_medium, 3);
        BridgeMetrics::inc(&m.publish_errors);
        m.disconnected(Ending::Timeout);
        collector.add(7, "tcp://h:5557", m);
        let families = registry.gather();
        let refused = families.iter().find(|f| f.name() == "prefixlog_bridge_events_refused_total").unwrap();
        assert_eq!(refused.get_metric().len(), 13, "one series per reason, zeros included");
        let medium = refused
            .get_metric()
            .iter()
            .find(|m| m.get_label().iter().any(|l| l.name() == "reason" && l.value() == "medium"))
            .unwrap();
        assert_eq!(medium.get_counter().value(), 3.0);
        let batches = families.iter().find(|f| f.name() == "prefixlog_bridge_batches_total").unwrap();
        assert_eq!(batches.get_metric().len(), 3);
        assert_eq!(families.len(), 18, "{:?}", families.iter().map(|f| f.name()).collect::<Vec<_>>());
        let disconnects = families.iter().find(|f| f.name() == "prefixlog_bridge_disconnects_total").unwrap();
        assert_eq!(disconnects.get_metric().len(), Ending::ALL.len(), "one series per ending");
        let resets = families.iter().find(|f| f.name() == "prefixlog_bridge_resets_total").unwrap();
        assert_eq!(resets.get_metric().len(), 2, "gap and lost");
        let timeout = disconnects
            .get_metric()
            .iter()
            .find(|m| m.get_label().iter().any(|l| l.name() == "reason" && l.value() == "timeout"))
            .unwrap();
        assert_eq!(timeout.get_counter().value(), 1.0);
    }
}
