//! Options shared by every subcommand that talks to the log: the Kafka connection and topic,
//! and the state-deciding settings (which every replica, audit and benchmark of one log must
//! agree on; replicas check it).

use clap::Args;
use prefixlog_ingest::{EmbeddedKafka, KafkaConnection, LogSpec};
use prefixlog_state::StateSettings;
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Args, Clone, Debug)]
pub struct KafkaArgs {
    /// Kafka bootstrap servers. Omit (serve, demo) to start librdkafka's embedded mock cluster
    /// in-process.
    #[arg(long, env = "PREFIXLOG_BROKERS")]
    pub brokers: Option<String>,
    /// The records topic.
    #[arg(long, env = "PREFIXLOG_TOPIC", default_value = "prefixlog.records")]
    pub topic: String,
    /// Partitions of the records topic. Every publisher and replica of a log must agree; a
    /// replica refuses to start when the topic has a different count.
    #[arg(long, env = "PREFIXLOG_PARTITIONS", default_value_t = 16)]
    pub partitions: u32,
    /// Extra librdkafka property, repeatable (e.g. -X security.protocol=SASL_SSL); in the
    /// environment, separated by ';'. Applied after --kafka-config. Production settings
    /// (TLS, SASL, MSK / Confluent Cloud / Strimzi): docs/operations.md, "Production Kafka".
    #[arg(short = 'X', env = "PREFIXLOG_KAFKA_PROPERTIES", value_delimiter = ';', value_parser = parse_kv)]
    pub property: Vec<(String, String)>,
    /// A file of librdkafka properties, one key=value a line ('#' starts a comment line): the
    /// place for secrets such as sasl.password (mount it from a Kubernetes Secret; a value may
    /// hold any character, ';' included). -X overrides it.
    #[arg(long, env = "PREFIXLOG_KAFKA_CONFIG")]
    pub kafka_config: Option<PathBuf>,
}

pub fn parse_kv(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("expected key=value, got {s:?}"))
}

impl KafkaArgs {
    /// The brokers, or an error naming the flag for commands that cannot start their own.
    pub fn require_brokers(&self, cmd: &str) -> anyhow::Result<String> {
        self.brokers.clone().ok_or_else(|| {
            anyhow::anyhow!(
                "{cmd} needs --brokers (the address a `prefixlog serve` printed, or a real cluster)"
            )
        })
    }

    /// The brokers, or an embedded broker started here with the topic (development only).
    pub fn brokers_or_embedded(&self) -> anyhow::Result<(String, Option<EmbeddedKafka>)> {
        if let Some(b) = &self.brokers {
            return Ok((b.clone(), None));
        }
        let e = EmbeddedKafka::start(&self.topic, self.partitions)?;
        let b = e.bootstrap_servers();
        tracing::warn!(
            bootstrap = %b,
            topic = %self.topic,
            partitions = self.partitions,
            "no --brokers given: started librdkafka's embedded mock cluster in this process \
             (development only: its log lives as long as this process, and it keeps at most 5 MiB \
             or 100,000 records per partition; publishers can connect to {b})"
        );
        Ok((b, Some(e)))
    }

    /// The log at `brokers` with default settings and every partition; the properties of
    /// --kafka-config, then -X.
    pub fn spec(&self, brokers: &str) -> anyhow::Result<LogSpec> {
        let mut properties = match &self.kafka_config {
            Some(path) => read_properties(path)?,
            None => Vec::new(),
        };
        properties.extend(self.property.iter().cloned());
        let kafka = KafkaConnection::new(brokers).with_properties(properties);
        Ok(LogSpec::new(kafka, &self.topic, self.partitions))
    }
}

/// A properties file: `key=value` lines; blank lines and lines starting with '#' are skipped;
/// whitespace around the key and the value is trimmed.
pub(crate) fn read_properties(path: &Path) -> anyhow::Result<Vec<(String, String)>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("--kafka-config {}: {e}", path.display()))?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (k, v) = line.split_once('=').ok_or_else(|| {
            // The line itself is not shown: it may be a secret missing its key.
            anyhow::anyhow!("--kafka-config {} line {}: expected key=value", path.display(), i + 1)
        })?;
        out.push((k.trim().to_string(), v.trim().to_string()));
    }
    Ok(out)
}

/// The settings that decide applied state. Every replica of a log must use the same values:
/// checkpoints record them, peers compare them, and a replica refuses a checkpoint applied with
/// other values.
#[derive(Args, Clone, Debug)]
#[command(next_help_heading = "State settings (every replica of a log must use the same values)")]
pub struct SettingsArgs {
    /// Placement TTL in log time (inferred blocks not placed again within it expire).
    #[arg(long, env = "PREFIXLOG_PLACEMENT_TTL", default_value = "2m", value_parser = humantime::parse_duration)]
    pub placement_ttl: Duration,
    /// Per-holder block bound for event-fed holders (a safety net for lost removals).
    #[arg(long, env = "PREFIXLOG_HOLDER_CAPACITY", default_value_t = StateSettings::default().holder_capacity)]
    pub holder_capacity: u32,
    /// Per-holder block bound for placement-only (inferred) holders.
    #[arg(long, env = "PREFIXLOG_INFERRED_CAPACITY", default_value_t = StateSettings::default().inferred_capacity)]
    pub inferred_capacity: u32,
    /// Blocks applied per engine write lock (each chunk is its own operation record).
    #[arg(long, env = "PREFIXLOG_MAX_BLOCKS_PER_LOCK", default_value_t = StateSettings::default().max_blocks_per_lock)]
    pub max_blocks_per_lock: u32,
    /// Records with more blocks are refused (too_many_blocks).
    #[arg(long, env = "PREFIXLOG_MAX_BLOCKS_PER_RECORD", default_value_t = StateSettings::default().max_blocks_per_record)]
    pub max_blocks_per_record: u32,
    /// Placement expiry granularity in log time.
    #[arg(long, env = "PREFIXLOG_EXPIRY_INTERVAL", default_value = "1s", value_parser = humantime::parse_duration)]
    pub expiry_interval: Duration,
    /// A digest point every this many offsets per partition (anti-entropy compares them).
    #[arg(long, env = "PREFIXLOG_DIGEST_INTERVAL", default_value_t = StateSettings::default().digest_interval)]
    pub digest_interval: u64,
    /// The most one record may move its partition's log time forward (a producer with a clock
    /// far ahead cannot expire every placement at once).
    #[arg(long, env = "PREFIXLOG_MAX_LOG_TIME_STEP", default_value = "1m", value_parser = humantime::parse_duration)]
    pub max_log_time_step: Duration,
    /// Limits on what records may create, each counted per partition: a record that would pass
    /// one is refused whole (skipped, counted by reason, dead-lettered). Keyspaces (model ×
    /// block size × hash scheme) a partition's feeds and holders may be in (too_many_keyspaces).
    #[arg(long, env = "PREFIXLOG_MAX_KEYSPACES_PER_PARTITION", default_value_t = StateSettings::default().max_keyspaces_per_partition)]
    pub max_keyspaces_per_partition: u32,
    /// Feeds (keyspace × worker × dp rank) per partition (too_many_feeds).
    #[arg(long, env = "PREFIXLOG_MAX_FEEDS_PER_PARTITION", default_value_t = StateSettings::default().max_feeds_per_partition)]
    pub max_feeds_per_partition: u32,
    /// Lanes one feed may name (too_many_lanes).
    #[arg(long, env = "PREFIXLOG_MAX_LANES_PER_FEED", default_value_t = StateSettings::default().max_lanes_per_feed)]
    pub max_lanes_per_feed: u32,
    /// Holders (keyspace × worker × dp rank × lane, fed or placed) per partition
    /// (too_many_holders).
    #[arg(long, env = "PREFIXLOG_MAX_HOLDERS_PER_PARTITION", default_value_t = StateSettings::default().max_holders_per_partition)]
    pub max_holders_per_partition: u32,
    /// Workers announced (WorkerAdded) per partition (too_many_workers).
    #[arg(long, env = "PREFIXLOG_MAX_WORKERS_PER_PARTITION", default_value_t = StateSettings::default().max_workers_per_partition)]
    pub max_workers_per_partition: u32,
    /// Bytes of one worker's metadata: keys and values, plus 32 per entry
    /// (metadata_too_large).
    #[arg(long, env = "PREFIXLOG_MAX_WORKER_METADATA_BYTES", default_value_t = StateSettings::default().max_worker_metadata_bytes)]
    pub max_worker_metadata_bytes: u32,
    /// The longest model name or lane kind a record may carry, in bytes (name_too_long).
    #[arg(long, env = "PREFIXLOG_MAX_NAME_BYTES", default_value_t = StateSettings::default().max_name_bytes)]
    pub max_name_bytes: u32,
}

impl SettingsArgs {
    pub fn settings(&self) -> StateSettings {
        StateSettings {
            placement_ttl_ms: self.placement_ttl.as_millis() as u64,
            holder_capacity: self.holder_capacity,
            inferred_capacity: self.inferred_capacity,
            max_blocks_per_lock: self.max_blocks_per_lock,
            max_blocks_per_record: self.max_blocks_per_record,
            expiry_interval_ms: self.expiry_interval.as_millis() as u64,
            digest_interval: self.digest_interval,
            max_log_time_step_ms: self.max_log_time_step.as_millis() as u64,
            max_keyspaces_per_partition: self.max_keyspaces_per_partition,
            max_feeds_per_partition: self.max_feeds_per_partition,
            max_lanes_per_feed: self.max_lanes_per_feed,
            max_holders_per_partition: self.max_holders_per_partition,
            max_workers_per_partition: self.max_workers_per_partition,
            max_worker_metadata_bytes: self.max_worker_metadata_bytes,
            max_name_bytes: self.max_name_bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_config_file_then_x_properties() {
        let dir = std::env::temp_dir().join(format!("prefixlog-kafka-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("client.properties");
        std::fs::write(&file, "# SASL\nsasl.username = app\n\nsasl.password=p;a=ss\nlinger.ms=7\n").unwrap();
        let args = KafkaArgs {
            brokers: None,
            topic: "t".into(),
            partitions: 1,
            property: vec![("linger.ms".into(), "9".into())],
            kafka_config: Some(file.clone()),
        };
        let spec = args.spec("b:9092").unwrap();
        let cc = spec.client_config(prefixlog_ingest::ClientRole::Publisher);
        assert_eq!(cc.get("sasl.username"), Some("app"));
        assert_eq!(cc.get("sasl.password"), Some("p;a=ss"), "';' and '=' belong to the value");
        assert_eq!(cc.get("linger.ms"), Some("9"), "-X overrides the file");
        std::fs::write(&file, "sasl.password\n").unwrap();
        let err = args.spec("b:9092").unwrap_err().to_string();
        assert!(err.contains("line 1: expected key=value"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
