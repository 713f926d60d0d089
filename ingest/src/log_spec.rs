//! Which log a process works on, and how it connects to it.
//!
//! [`LogSpec`] is the one description of a log every part of prefixlog takes: the Kafka
//! connection, the topic and its partition count, the partitions this process owns (its shard)
//! and the [`StateSettings`] that decide applied state. [`KafkaConnection::client_config`] is
//! the one place a librdkafka client is configured, for every role (replica consumer, bounded
//! replays, publishers, the dead-letter copy, probes), so what a flag like `-X` changes is the
//! same everywhere.

use prefixlog_state::settings::StateSettings;
use rdkafka::config::ClientConfig;
use std::fmt;
use std::time::Instant;

/// Brokers plus extra librdkafka properties (SASL/SSL, tuning), applied after the role's own
/// settings so an operator can override any of them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KafkaConnection {
    pub brokers: String,
    pub properties: Vec<(String, String)>,
}

/// The longest a client waits between lookups of a partition without a leader (and between
/// retries of a request).
const RETRY_BACKOFF_MAX_MS: &str = "250";

/// `fetch.max.bytes` of a [`ClientRole::Replayer`], for the whole request: 512 KiB, about 250
/// records of the trace workload.
const REPLAY_FETCH_MAX_BYTES: &str = "524288";

/// What a client is for: each role has its own librdkafka settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClientRole {
    /// Reads partitions by manual assignment, never commits, never resets an offset silently:
    /// an out-of-range offset is an error the reader turns into a discontinuity. Reads committed
    /// records only (`isolation.level=read_committed`, librdkafka's default, set explicitly):
    /// records of aborted transactions are never applied, and leave a hole (docs/operations.md,
    /// "The topic": the topic must not be written with transactions).
    Reader,
    /// A [`ClientRole::Reader`] of a stretch of history with a known end (replays, audits),
    /// with small fetches that do not wait:
    /// - each request asks for at most 512 KiB. What a request returns past the replay's end is
    ///   read for nothing, and librdkafka's default request (50 MiB) is spent by some brokers
    ///   on the first partitions listed (tansu caps it at 5 MiB and ignores the per-partition
    ///   cap): an audit's replay from a checkpoint fetched about 1.5× the records it applied.
    /// - the broker waits at most 1 ms for data. History is there to read, so on Kafka the
    ///   wait never starts; tansu sleeps it out after every request, full or not, which cost
    ///   small requests 10 ms each at the live reader's setting (README, Audit benchmark).
    Replayer,
    /// A [`ClientRole::Replayer`] that is also given records of open and aborted transactions
    /// (`read_uncommitted`): the second read that explains a hole in the log.
    UncommittedReader,
    /// Metadata and watermarks only.
    Probe,
    /// Idempotent keyed producer (`acks=all`), bounded queue.
    Publisher,
    /// Best-effort copies of refused records.
    DeadLetter,
}

impl KafkaConnection {
    pub fn new(brokers: impl Into<String>) -> Self {
        Self { brokers: brokers.into(), properties: Vec::new() }
    }

    pub fn with_properties(mut self, properties: Vec<(String, String)>) -> Self {
        self.properties = properties;
        self
    }

    /// The configuration of a client in `role`.
    pub fn client_config(&self, role: ClientRole) -> ClientConfig {
        let mut cc = ClientConfig::new();
        cc.set("bootstrap.servers", &self.brokers)
            // A partition that lost its leader is looked up again after 100 ms, then backing off
            // up to this (librdkafka's default is 1 s): a leader elected after a long outage is
            // found within 250 ms, not up to a second later (a replica's reader also looks leaders up itself after a failure: `leader_watch`).
            .set("retry.backoff.max.ms", RETRY_BACKOFF_MAX_MS);
        match role {
            ClientRole::Reader | ClientRole::Replayer | ClientRole::UncommittedReader => {
                // group.id is required by librdkafka's consumer even with manual assignment;
                // nothing is ever committed under it.
                cc.set("group.id", "prefixlog-reader-unused")
                    .set("enable.auto.commit", "false")
                    .set("enable.auto.offset.store", "false")
                    .set("auto.offset.reset", "error");
                let isolation =
                    if role == ClientRole::UncommittedReader { "read_uncommitted" } else { "read_committed" };
                cc.set("isolation.level", isolation);
                if role == ClientRole::Reader {
                    // A fetch that failed (its leader gone) is tried again after 100 ms, not
                    // librdkafka's 500: a replica reads from a new leader as soon as it is known.
                    cc.set("fetch.wait.max.ms", "10").set("fetch.error.backoff.ms", "100");
                } else {
                    // librdkafka refuses a fetch.max.bytes below message.max.bytes (1 MB by
                    // default), which a consumer uses for nothing else; a larger record is
                    // still returned whole (a fetch returns at least one batch).
                    cc.set("fetch.max.bytes", REPLAY_FETCH_MAX_BYTES)
                        .set("message.max.bytes", REPLAY_FETCH_MAX_BYTES)
                        .set("fetch.wait.max.ms", "1");
                }
            }
            ClientRole::Probe => {
                cc.set("group.id", "prefixlog-probe-unused");
            }
            ClientRole::Publisher => {
                cc.set("enable.idempotence", "true")
                    .set("acks", "all")
                    .set("linger.ms", "5")
                    .set("queue.buffering.max.messages", "100000")
                    .set("queue.buffering.max.kbytes", "262144")
                    .set("message.timeout.ms", "300000");
            }
            ClientRole::DeadLetter => {
                cc.set("linger.ms", "5");
            }
        }
        for (k, v) in &self.properties {
            cc.set(k, v);
        }
        cc
    }
}

/// The partitions a replica owns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Shard {
    /// Every partition (an unsharded replica).
    All,
    /// Shard `index` of `count`: the partitions `p` with `p % count == index`.
    Slice { index: u32, count: u32 },
    /// An explicit set of partitions.
    List(Vec<u32>),
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ShardError {
    #[error("shard {index}/{count}: the index must be below the count")]
    IndexOutOfRange { index: u32, count: u32 },
    #[error("shard {index}/{count} owns no partition of a {partitions}-partition log")]
    Empty { index: u32, count: u32, partitions: u32 },
    #[error("partition {partition} does not exist (the log has {partitions})")]
    NoSuchPartition { partition: u32, partitions: u32 },
    #[error("an explicit partition list must not be empty")]
    EmptyList,
    #[error("expected I/N (e.g. 0/2), got {0:?}")]
    Syntax(String),
}

impl std::str::FromStr for Shard {
    type Err = ShardError;

    /// `I/N` (shard I of N) or `all`.
    fn from_str(s: &str) -> Result<Self, ShardError> {
        if s == "all" {
            return Ok(Shard::All);
        }
        let bad = || ShardError::Syntax(s.to_string());
        let (i, n) = s.split_once('/').ok_or_else(bad)?;
        let (index, count) = (i.trim().parse().map_err(|_| bad())?, n.trim().parse().map_err(|_| bad())?);
        if index >= count {
            return Err(ShardError::IndexOutOfRange { index, count });
        }
        Ok(Shard::Slice { index, count })
    }
}

impl fmt::Display for Shard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Shard::All => f.write_str("all"),
            Shard::Slice { index, count } => write!(f, "{index}/{count}"),
            Shard::List(l) => write!(f, "{l:?}"),
        }
    }
}

impl Shard {
    /// The owned partitions of a `partitions`-partition log, ascending.
    pub fn resolve(&self, partitions: u32) -> Result<Vec<u32>, ShardError> {
        let owned: Vec<u32> = match self {
            Shard::All => (0..partitions).collect(),
            Shard::Slice { index, count } => {
                if index >= count {
                    return Err(ShardError::IndexOutOfRange { index: *index, count: *count });
                }
                (0..partitions).filter(|p| p % count == *index).collect()
            }
            Shard::List(l) => {
                if l.is_empty() {
                    return Err(ShardError::EmptyList);
                }
                if let Some(&p) = l.iter().find(|&&p| p >= partitions) {
                    return Err(ShardError::NoSuchPartition { partition: p, partitions });
                }
                let mut v = l.clone();
                v.sort_unstable();
                v.dedup();
                v
            }
        };
        if owned.is_empty() {
            let (index, count) = self.label();
            return Err(ShardError::Empty { index, count, partitions });
        }
        Ok(owned)
    }

    /// `(index, count)` as `Describe` reports it: `(0, 1)` unsharded, `(0, 0)` for a list.
    pub fn label(&self) -> (u32, u32) {
        match self {
            Shard::All => (0, 1),
            Shard::Slice { index, count } => (*index, *count),
            Shard::List(_) => (0, 0),
        }
    }
}

/// One log, as a replica, a publisher, an audit or a repair sees it.
#[derive(Clone, Debug)]
pub struct LogSpec {
    pub kafka: KafkaConnection,
    pub topic: String,
    /// Partitions of the topic. Every publisher and replica of a log must agree: workers are
    /// placed by [`prefixlog_engine::partition_of`] over this count.
    pub partitions: u32,
    pub shard: Shard,
    /// `shard` resolved against `partitions`, ascending.
    owned: Vec<u32>,
    pub settings: StateSettings,
}

impl LogSpec {
    /// An unsharded log with default settings.
    pub fn new(kafka: KafkaConnection, topic: impl Into<String>, partitions: u32) -> Self {
        Self {
            kafka,
            topic: topic.into(),
            partitions,
            shard: Shard::All,
            owned: (0..partitions).collect(),
            settings: StateSettings::default(),
        }
    }

    pub fn with_settings(mut self, settings: StateSettings) -> Self {
        self.settings = settings;
        self
    }

    /// Restricts the spec to a shard of the log.
    pub fn with_shard(mut self, shard: Shard) -> Result<Self, ShardError> {
        self.owned = shard.resolve(self.partitions)?;
        self.shard = shard;
        Ok(self)
    }

    /// The owned partitions, ascending.
    pub fn owned(&self) -> &[u32] {
        &self.owned
    }

    pub fn owns(&self, partition: u32) -> bool {
        self.owned.binary_search(&partition).is_ok()
    }

    pub fn client_config(&self, role: ClientRole) -> ClientConfig {
        self.kafka.client_config(role)
    }
}

/// Clients [`close_in_background`] is closing. A process joins them before it exits
/// ([`wait_for_closing_clients`]): an exit in the middle of librdkafka's destroy would tear
/// down what it still uses (TLS libraries clean up in exit handlers).
static CLOSING: parking_lot::Mutex<Vec<std::thread::JoinHandle<()>>> = parking_lot::Mutex::new(Vec::new());

/// Drops a Kafka client on a thread of its own. librdkafka's destroy waits for the client's
/// internal threads to wind down, which took ~0.1 s per consumer on tansu: a bounded replay
/// (an audit, a repair) or a probe that is done with its client has no reason to wait for
/// that.
pub fn close_in_background<C: Send + 'static>(client: C, what: &'static str) {
    let spawned = std::thread::Builder::new().name(format!("close-{what}")).spawn(move || {
        let started = Instant::now();
        drop(client);
        tracing::debug!(what, secs = started.elapsed().as_secs_f64(), "Kafka client closed");
    });
    match spawned {
        Ok(handle) => {
            let mut closing = CLOSING.lock();
            closing.retain(|h| !h.is_finished());
            closing.push(handle);
        }
        // The failed spawn dropped the closure, and the client with it, right here.
        Err(e) => tracing::warn!(what, error = %e, "no thread to close a Kafka client on; closed it inline"),
    }
}

/// Waits until every client handed to [`close_in_background`] is closed (call before the
/// process exits).
pub fn wait_for_closing_clients() {
    let closing = std::mem::take(&mut *CLOSING.lock());
    for h in closing {
        // A panic while closing was already reported by the panic hook; nothing to add.
        let _ = h.join();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_partition_the_log() {
        let a = Shard::Slice { index: 0, count: 2 }.resolve(5).unwrap();
        let b = Shard::Slice { index: 1, count: 2 }.resolve(5).unwrap();
        assert_eq!((a, b), (vec![0, 2, 4], vec![1, 3]));
        assert_eq!("1/3".parse::<Shard>(), Ok(Shard::Slice { index: 1, count: 3 }));
        assert_eq!("3/3".parse::<Shard>(), Err(ShardError::IndexOutOfRange { index: 3, count: 3 }));
        assert!("x".parse::<Shard>().is_err());
        assert_eq!(
            Shard::Slice { index: 3, count: 4 }.resolve(2),
            Err(ShardError::Empty { index: 3, count: 4, partitions: 2 })
        );
        assert_eq!(Shard::List(vec![3, 1, 3]).resolve(4).unwrap(), vec![1, 3]);
        assert_eq!(
            Shard::List(vec![4]).resolve(4),
            Err(ShardError::NoSuchPartition { partition: 4, partitions: 4 })
        );
    }

    #[test]
    fn operator_properties_override_role_settings() {
        let k = KafkaConnection::new("b:9092").with_properties(vec![("linger.ms".into(), "50".into())]);
        assert_eq!(k.client_config(ClientRole::Publisher).get("linger.ms"), Some("50"));
        assert_eq!(k.client_config(ClientRole::Reader).get("auto.offset.reset"), Some("error"));
        assert_eq!(k.client_config(ClientRole::Reader).get("fetch.max.bytes"), None);
        assert_eq!(k.client_config(ClientRole::Reader).get("fetch.wait.max.ms"), Some("10"));
        let replayer = k.client_config(ClientRole::Replayer);
        assert_eq!(replayer.get("auto.offset.reset"), Some("error"));
        assert_eq!(replayer.get("fetch.max.bytes"), Some("524288"));
        assert_eq!(replayer.get("fetch.wait.max.ms"), Some("1"));
        // librdkafka accepts the combination (it checks fetch.max.bytes >= message.max.bytes
        // when the client is created; no broker is contacted).
        let _: rdkafka::consumer::BaseConsumer = replayer.create().expect("a valid replayer config");
        let overridden = KafkaConnection::new("b:9092")
            .with_properties(vec![("fetch.max.bytes".into(), "5242880".into())]);
        assert_eq!(overridden.client_config(ClientRole::Replayer).get("fetch.max.bytes"), Some("5242880"));
    }
}
