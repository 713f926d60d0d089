//! What the Kafka benchmarks share: a topic of their own (on the embedded broker, or on a real
//! one with `--brokers`), a publisher, replicas started the one way (`ReplicaNode`), and
//! publishing records grouped by worker.

use prefixlog_ingest::{create_topic, delete_topic, EmbeddedKafka, KafkaConnection, LogSpec, Publisher};

use prefixlog_node::{NodeOptions, ReplicaNode};
use prefixlog_proto::v1::match_request::Prompt;
use prefixlog_proto::v1::{BlockHashes, Keyspace, MatchRequest};
use prefixlog_state::{Landed, NextOffset};
use prefixlog_workload::{generate, load_trace, FleetConfig, Step};

/// Where a benchmark's log lives.
#[derive(clap::Args, Clone, Debug)]
pub struct BenchLogArgs {
    /// A real broker to run on (e.g. tansu: `scripts/with-tansu.sh` exports PREFIXLOG_TEST_KAFKA):
    /// the benchmark creates a topic of its own there and deletes it at the end. Omit for the
    /// embedded broker, whose retention (5 MiB or 100,000 messages per partition) cannot hold
    /// long logs.
    #[arg(long = "brokers", env = "PREFIXLOG_BENCH_BROKERS")]
    pub brokers: Option<String>,
    /// Partitions of the benchmark topic.
    #[arg(long, env = "PREFIXLOG_BENCH_PARTITIONS", default_value_t = 16)]
    pub partitions: u32,
    /// Pin the embedded broker's threads to these CPUs (e.g. `0`: the log side on one core).
    #[arg(long, env = "PREFIXLOG_BENCH_BROKER_CPUS")]
    pub broker_cpus: Option<prefixlog_ingest::CpuSet>,
    /// Extra librdkafka property for every client of the benchmark, repeatable (as `serve -X`).
    #[arg(short = 'X', env = "PREFIXLOG_BENCH_KAFKA_PROPERTIES", value_delimiter = ';', value_parser = prefixlog::kafka_args::parse_kv)]
    pub property: Vec<(String, String)>,
}

pub struct BenchLog {
    pub publisher: Publisher,
    pub spec: LogSpec,
    /// The topic was created on a real broker: deleted by [`BenchLog::finish`].
    created: bool,
    /// Last: fields drop in order, and the broker must outlive its clients.
    _kafka: Option<EmbeddedKafka>,
}

/// A benchmark replica: a query port only (no admin or peer port, no ticks).
pub fn bench_options() -> NodeOptions {
    NodeOptions { replica_id: "bench".into(), admin_addr: None, peer_addr: None, ..NodeOptions::default() }
}

impl BenchLog {
    /// A fresh topic named after `topic` (plus the process id on a real broker).
    pub async fn start(broker: &BenchLogArgs, topic: &str) -> anyhow::Result<Self> {
        let partitions = broker.partitions;
        let (spec, kafka) = match &broker.brokers {
            None => {
                let kafka = match broker.broker_cpus.clone() {
                    None => EmbeddedKafka::start(topic, partitions)?,
                    // librdkafka's mock cluster threads inherit the CPU set of their creator.
                    Some(cpus) => cpus.run_pinned(|| EmbeddedKafka::start(topic, partitions))??,
                };
                let conn =
                    KafkaConnection::new(kafka.bootstrap_servers()).with_properties(broker.property.clone());
                (LogSpec::new(conn, topic, partitions), Some(kafka))
            }
            Some(b) => {
                let topic = format!("{topic}-{}", std::process::id());
                let conn = KafkaConnection::new(b.clone()).with_properties(broker.property.clone());
                create_topic(&conn, &topic, partitions, &[]).await?;
                (LogSpec::new(conn, topic, partitions), None)
            }
        };
        println!(
            "log: topic {} ({} partitions) on {}",
            spec.topic,
            partitions,
            if kafka.is_some() { "the embedded broker".to_string() } else { spec.kafka.brokers.clone() }
        );
        let created = kafka.is_none();
        Ok(Self { publisher: Publisher::new(&spec)?, spec, created, _kafka: kafka })
    }

    /// Deletes the benchmark's topic from a real broker (best effort).
    pub async fn finish(self) {
        let Self { publisher, spec, created, _kafka } = self;
        drop(publisher);
        if created {
            if let Err(e) = delete_topic(&spec.kafka, &spec.topic).await {
                eprintln!("could not delete the benchmark topic {}: {e}", spec.topic);
            }
        }
    }

    /// A replica of the benchmark log.
    pub async fn node(&self, opts: NodeOptions) -> anyhow::Result<ReplicaNode> {
        Ok(ReplicaNode::start(self.spec.clone(), opts).await?)
    }

    /// Publishes `(worker, timestamp ms, value)` with one task per worker (each worker's records
    /// in order). Returns where they landed. Fails if the embedded broker dropped any record:
    /// its retention is fixed (5 MiB or 100,000 messages per partition) and a benchmark over a
    /// truncated log would compare different states.
    pub async fn publish(&self, items: Vec<(u64, i64, Vec<u8>)>) -> anyhow::Result<Vec<Landed>> {
        let landed = prefixlog::publish_trace::publish_by_worker(&self.publisher, items).await?;
        let probe = prefixlog_ingest::probe_log(&self.spec)?;
        if let Some((p, w)) = probe.watermarks.iter().find(|(_, w)| w.low > 0) {
            let low = w.low;
            anyhow::bail!(
                "the broker dropped the start of partition {p} (low watermark {low}); the embedded \
                 broker's retention is 5 MiB or 100,000 messages per partition: use more \
                 --partitions, or a real broker with --brokers"
            );
        }
        Ok(landed)
    }
}

/// A consistency token covering every landed record (next offsets).
pub fn token(landed: &[Landed]) -> Vec<NextOffset> {
    prefixlog_state::token_of(landed)
}

/// The workload's own queries (each request's prompt as precomputed block hashes, in trace
/// order), for `workload`'s fleet: what the gateways of the benchmarks ask.
pub fn workload_queries(
    workload: &prefixlog::fleet_records::WorkloadArgs,
    top_k: Option<u32>,
) -> anyhow::Result<std::sync::Arc<[MatchRequest]>> {
    let mut hours = workload_queries_by_hour(workload, top_k, 1)?;
    Ok(hours.swap_remove(0))
}

/// [`workload_queries`] of each of `hours` hours of the workload (the trace repeated with new
/// content each hour, as `fleet_records(workload, hours)` publishes it).
pub fn workload_queries_by_hour(
    workload: &prefixlog::fleet_records::WorkloadArgs,
    top_k: Option<u32>,
    hours: usize,
) -> anyhow::Result<Vec<std::sync::Arc<[MatchRequest]>>> {
    let trace = load_trace(std::path::Path::new(&workload.trace))?;
    let trace = if hours > 1 { prefixlog_workload::trace::repeat_hours(&trace, hours) } else { trace };
    let cfg = FleetConfig {
        workers: workload.workers,
        capacity_blocks: workload.capacity,
        stretch: workload.stretch,
        copies: workload.copies,
        seed: 1,
    };
    let ks = prefixlog::fleet_records::keyspace();
    let keyspace = Keyspace { model: ks.model.clone(), block_size: ks.block_size, hash_scheme: ks.scheme };
    let all: Vec<MatchRequest> = generate(&trace, &cfg)
        .into_iter()
        .filter_map(|s| match s {
            Step::Match { locals } => Some(MatchRequest {
                keyspace: Some(keyspace.clone()),
                prompt: Some(Prompt::Hashes(BlockHashes { local: locals })),
                top_k,
                ..Default::default()
            }),
            _ => None,
        })
        .collect();
    // Every hour has the same requests (one Match per request and copy), in time order.
    let per_hour = all.len().div_ceil(hours.max(1)).max(1);
    Ok(all.chunks(per_hour).map(std::sync::Arc::from).collect())
}
