//! What the broker says about a log right now: cluster id, partition count, and the retained
//! range (low and high watermark) of every owned partition. Start-up continuity checks,
//! bounded replays and benchmarks read it; the running replica polls watermarks itself.

use crate::connect::ConnectErrors;
use crate::log_spec::{close_in_background, ClientRole, LogSpec};
use prefixlog_state::log::{LogProbe, Watermarks};
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::metadata::Metadata;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// How long a start-up probe waits for the brokers to answer metadata.
const METADATA_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    /// A TLS or SASL failure: retrying would not help.
    #[error(
        "kafka at {brokers} refused the connection: {cause} (check the -X settings: \
         security.protocol, ssl.ca.location, sasl.mechanism, sasl.username, sasl.password)"
    )]
    Refused { brokers: String, cause: String },
    #[error(
        "no metadata from kafka at {brokers} within {}s: {error}; last connection error: {}",
        METADATA_TIMEOUT.as_secs(),
        cause.as_deref().unwrap_or("none reported")
    )]
    Unreachable { brokers: String, error: String, cause: Option<String> },
    #[error("topic {0:?} does not exist (create it with the configured partition count)")]
    NoTopic(String),
    #[error(
        "topic {topic:?} has {actual} partitions but this process is configured for {expected}: \
         refusing to start (worker → partition placement would differ)"
    )]
    PartitionMismatch { topic: String, expected: u32, actual: u32 },
}

/// The topic's partition count from broker metadata.
pub fn topic_partitions<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    topic: &str,
) -> Result<u32, ProbeError> {
    let md = consumer.fetch_metadata(Some(topic), METADATA_TIMEOUT)?;
    partitions_in(&md, topic)
}

fn partitions_in(md: &Metadata, topic: &str) -> Result<u32, ProbeError> {
    let t =
        md.topics().iter().find(|t| t.name() == topic).ok_or_else(|| ProbeError::NoTopic(topic.into()))?;
    if t.error().is_some() || t.partitions().is_empty() {
        return Err(ProbeError::NoTopic(topic.into()));
    }
    Ok(t.partitions().len() as u32)
}

/// The topic's metadata, asked for in rounds of 1, 2, 4... s: a TLS or SASL failure ends the
/// wait after the round that saw it ([`ProbeError::Refused`]), anything else after
/// [`METADATA_TIMEOUT`] with the last connection error librdkafka reported
/// ([`ProbeError::Unreachable`]). Rounds grow so that a slow broker still gets a long wait.
fn metadata_or_cause(consumer: &BaseConsumer<ConnectErrors>, spec: &LogSpec) -> Result<Metadata, ProbeError> {
    let deadline = Instant::now() + METADATA_TIMEOUT;
    let brokers = || spec.kafka.brokers.clone();
    let mut round = Duration::from_secs(1);
    loop {
        round = round.min(deadline.saturating_duration_since(Instant::now()));
        let error = match consumer.fetch_metadata(Some(&spec.topic), round) {
            Ok(md) => return Ok(md),
            Err(e) => e,
        };
        // Error events reach the context only when the consumer's queue is served. A poll
        // returns None for an empty queue and for a log event it handled alike, so the queue
        // is served a fixed number of times (an empty queue answers at once).
        for _ in 0..256 {
            let _ = consumer.poll(Duration::ZERO);
        }
        let seen = consumer.context();
        if let Some(f) = seen.conclusive() {
            return Err(ProbeError::Refused { brokers: brokers(), cause: f.reason });
        }
        if Instant::now() >= deadline {
            let cause = seen.last().map(|f| f.reason);
            return Err(ProbeError::Unreachable { brokers: brokers(), error: error.to_string(), cause });
        }
        round *= 2;
    }
}

/// Checks that the brokers answer with these connection settings and that the topic has the
/// spec's partition count (publishers, before their first record: a wrong setting fails here,
/// named, instead of a publish timing out minutes later).
pub fn check_topic(spec: &LogSpec) -> Result<(), ProbeError> {
    let consumer = probe_consumer(spec)?;
    let partitions = partitions_in(&metadata_or_cause(&consumer, spec)?, &spec.topic)?;
    close_in_background(consumer, "probe");
    same_partitions(spec, partitions)
}

fn probe_consumer(spec: &LogSpec) -> Result<BaseConsumer<ConnectErrors>, ProbeError> {
    Ok(spec.client_config(ClientRole::Probe).create_with_context(ConnectErrors::default())?)
}

fn same_partitions(spec: &LogSpec, actual: u32) -> Result<(), ProbeError> {
    if actual != spec.partitions {
        return Err(ProbeError::PartitionMismatch {
            topic: spec.topic.clone(),
            expected: spec.partitions,
            actual,
        });
    }
    Ok(())
}

/// Probes the log; refuses a topic whose partition count differs from the spec's.
pub fn probe_log(spec: &LogSpec) -> Result<LogProbe, ProbeError> {
    let consumer = probe_consumer(spec)?;
    let partitions = partitions_in(&metadata_or_cause(&consumer, spec)?, &spec.topic)?;
    same_partitions(spec, partitions)?;
    let cluster_id = consumer.client().fetch_cluster_id(Duration::from_secs(10)).unwrap_or_default();
    let watermarks = watermarks_of(&consumer, &spec.topic, spec.owned())?;
    close_in_background(consumer, "probe");
    Ok(LogProbe { cluster_id, partitions, watermarks })
}

/// At most this many watermark requests in flight at once (each is a thread for its
/// duration).
const WATERMARK_REQUESTS_IN_FLIGHT: usize = 16;

/// Every partition's watermarks, asked for [`WATERMARK_REQUESTS_IN_FLIGHT`] at a time: each is
/// two round trips to the partition's leader, and one after the other they made a probe of 64
/// partitions take ~100 ms (most of a short audit's fixed cost).
fn watermarks_of<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    topic: &str,
    partitions: &[u32],
) -> Result<BTreeMap<u32, Watermarks>, ProbeError> {
    let per_thread = partitions.len().div_ceil(WATERMARK_REQUESTS_IN_FLIGHT).max(1);
    let asked: Vec<Result<Vec<(u32, Watermarks)>, ProbeError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = partitions
            .chunks(per_thread)
            .map(|chunk| {
                scope.spawn(move || {
                    chunk
                        .iter()
                        .map(|&p| {
                            let (low, high) = consumer.fetch_watermarks(topic, p as i32, METADATA_TIMEOUT)?;
                            Ok((p, Watermarks { low, high }))
                        })
                        .collect()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("a watermark request panicked")).collect()
    });
    let mut watermarks = BTreeMap::new();
    for chunk in asked {
        watermarks.extend(chunk?);
    }
    Ok(watermarks)
}

/// What the broker says about the topic's `cleanup.policy`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CleanupPolicy {
    /// `delete` (time/size retention): offsets stay dense, a gap is data loss — what prefixlog
    /// is built for.
    Delete,
    /// Compaction keeps only the newest record per key: a replica would apply a worker's last
    /// batch without the ones before it. Refused.
    Compacted(String),
    /// The broker could not say (no DescribeConfigs: the embedded broker, some proxies).
    Unknown(String),
}

/// Asks the broker for the topic's cleanup policy (bounded by 2 s: a broker answers in
/// milliseconds; one that does not implement DescribeConfigs, like the embedded broker, would
/// otherwise hold every start for the request timeout).
pub async fn cleanup_policy(spec: &LogSpec) -> CleanupPolicy {
    use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
    use rdkafka::client::DefaultClientContext;
    let admin: AdminClient<DefaultClientContext> = match spec.client_config(ClientRole::Probe).create() {
        Ok(a) => a,
        Err(e) => return CleanupPolicy::Unknown(e.to_string()),
    };
    let opts = AdminOptions::new().request_timeout(Some(Duration::from_secs(1)));
    let topic = ResourceSpecifier::Topic(&spec.topic);
    let asked = tokio::time::timeout(Duration::from_secs(2), admin.describe_configs([&topic], &opts)).await;
    let found = match asked {
        Ok(Ok(results)) => results.into_iter().next(),
        Ok(Err(e)) => return CleanupPolicy::Unknown(e.to_string()),
        Err(_) => return CleanupPolicy::Unknown("no answer to DescribeConfigs within 2 s".into()),
    };
    match found {
        Some(Ok(resource)) => match resource.get("cleanup.policy").and_then(|e| e.value.clone()) {
            Some(p) if p.contains("compact") => CleanupPolicy::Compacted(p),
            Some(_) => CleanupPolicy::Delete,
            None => CleanupPolicy::Unknown("no cleanup.policy entry".into()),
        },
        Some(Err(e)) => CleanupPolicy::Unknown(format!("{e:?}")),
        None => CleanupPolicy::Unknown("empty DescribeConfigs answer".into()),
    }
}
