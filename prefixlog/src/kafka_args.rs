//! Kafka options shared by every subcommand that talks to the log.

use clap::Args;

#[derive(Args, Clone, Debug)]
pub struct KafkaArgs {
    /// Kafka bootstrap servers. Omit to start librdkafka's embedded mock cluster in-process.
    #[arg(long, env = "PREFIXLOG_BROKERS")]
    pub brokers: Option<String>,
    /// The records topic.
    #[arg(long, env = "PREFIXLOG_TOPIC", default_value = "prefixlog.records")]
    pub topic: String,
    /// Partitions of the records topic. Every publisher and replica of a log must agree; a
    /// replica refuses to start when the topic has a different count.
    #[arg(long, env = "PREFIXLOG_PARTITIONS", default_value_t = 16)]
    pub partitions: u32,
    /// Extra librdkafka property, repeatable (e.g. -X security.protocol=SASL_SSL).
    #[arg(short = 'X', value_parser = parse_kv)]
    pub property: Vec<(String, String)>,
}

fn parse_kv(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("expected key=value, got {s:?}"))
}
