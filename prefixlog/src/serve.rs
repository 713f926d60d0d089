//! `prefixlog serve`: an index replica (flags → `LogSpec` + `NodeOptions` → `ReplicaNode`).

// `try_map` in the --http-dialect parser.
use clap::builder::TypedValueParser as _;
use prefixlog::kafka_args::{KafkaArgs, SettingsArgs};
use prefixlog_ingest::Shard;
use prefixlog_node::{CheckpointPolicy, GapChoice, NodeOptions, ReplicaNode, SettingsChange};
use prefixlog_snapshot::Retention;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::Duration;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub kafka: KafkaArgs,
    /// The partitions this replica owns: `I/N` (shard I of N: partitions p with p % N == I) or
    /// `all`. Clients send one Match per shard and merge.
    #[arg(long, env = "PREFIXLOG_SHARD", default_value = "all")]
    pub shard: Shard,
    /// How often to log progress (offsets, lag, state size).
    #[arg(long, env = "PREFIXLOG_STATUS_INTERVAL", default_value = "10s", value_parser = humantime::parse_duration)]
    pub status_interval: Duration,
    /// Append a tick record to every owned partition this often (0s disables), so that log
    /// time — and with it placement expiry — advances on quiet partitions. Ticks are
    /// idempotent: any number of replicas may publish them.
    #[arg(long, env = "PREFIXLOG_TICK_INTERVAL", default_value = "1s", value_parser = humantime::parse_duration)]
    pub tick_interval: Duration,
    /// Copy every refused record to this topic, bytes and key unchanged, with headers
    /// prefixlog-source-topic/-partition/-offset and prefixlog-reason. Best effort. Every
    /// replica that has it set copies the same records: set it on one replica.
    #[arg(long, env = "PREFIXLOG_DEAD_LETTER_TOPIC")]
    pub dead_letter_topic: Option<String>,
    /// Directory of the RocksDB checkpoint store. Without it the replica keeps no checkpoints
    /// and replays the whole log on every start.
    #[arg(long, env = "PREFIXLOG_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// Take a checkpoint this often (wall time; 0s disables the timer).
    #[arg(long, env = "PREFIXLOG_CHECKPOINT_INTERVAL", default_value = "60s", value_parser = humantime::parse_duration)]
    pub checkpoint_interval: Duration,
    /// Also take a checkpoint after this many records (0 disables).
    #[arg(long, env = "PREFIXLOG_CHECKPOINT_RECORDS", default_value_t = 1_000_000)]
    pub checkpoint_records: u64,
    /// Retention: keep this many newest checkpoints...
    #[arg(long, env = "PREFIXLOG_KEEP_CHECKPOINTS", default_value_t = 3)]
    pub keep_checkpoints: usize,
    /// ...plus the oldest checkpoint of every hour of log time within this window (audits).
    #[arg(long, env = "PREFIXLOG_KEEP_HOURLY_FOR", default_value = "24h", value_parser = humantime::parse_duration)]
    pub keep_hourly_for: Duration,
    /// Start (and keep running) even when the log no longer continues a partition's state:
    /// read on from the log's first offset and mark that partition's holders gapped. Without
    /// it such a replica refuses to start, or halts the partition, unless a peer can provide
    /// a state the log continues.
    #[arg(long, env = "PREFIXLOG_ACCEPT_LOG_GAPS")]
    pub accept_log_gaps: bool,
    /// When the checkpoints were applied with other state settings, replay the log with the
    /// new ones instead of refusing to start.
    #[arg(long, env = "PREFIXLOG_REPLAY_ON_SETTINGS_CHANGE")]
    pub replay_on_settings_change: bool,
    /// On SIGTERM: how long in-flight queries may take to finish.
    #[arg(long, env = "PREFIXLOG_SHUTDOWN_GRACE", default_value = "5s", value_parser = humantime::parse_duration)]
    pub shutdown_grace: Duration,
    /// Pin the ingest thread and its Kafka consumer's threads to these CPUs (Linux; e.g. `0`
    /// or `0-1`), so that catching up at full speed leaves the other CPUs to queries. Default:
    /// unpinned.
    #[arg(long, env = "PREFIXLOG_INGEST_CPUS")]
    pub ingest_cpus: Option<prefixlog_ingest::CpuSet>,
    /// Pin the query side to these CPUs (e.g. `1`, or `1-3`): the process is pinned before its
    /// runtime starts, so the gRPC server's threads (one runtime worker per CPU named) and
    /// every thread started later run there, except the ingest thread and its consumer when
    /// `--ingest-cpus` names others. Both together give a catch-up at full speed and the
    /// queries separate cores. Unset: unpinned.
    #[arg(long, env = "PREFIXLOG_QUERY_CPUS")]
    pub query_cpus: Option<prefixlog_ingest::CpuSet>,
    /// Keep two copies of every keyspace, so a query never waits on a write: the ingest thread
    /// applies each write to the copy queries are not reading, switches them over, then applies
    /// it to the other. Costs twice the engine's memory and write work; answers, digests and
    /// checkpoints are unchanged (not a state setting). For machines where catching up would
    /// otherwise stretch query tails (few cores, virtual CPUs).
    #[arg(long, env = "PREFIXLOG_QUERY_COPY")]
    pub query_copy: bool,
    #[command(flatten)]
    pub query: QueryArgs,
    #[command(flatten)]
    pub peer: PeerArgs,
    #[command(flatten)]
    pub sgl: SglArgs,
    #[command(flatten)]
    pub epp: crate::epp_args::EppArgs,
    /// Last: its help heading applies to every argument after it.
    #[command(flatten)]
    pub settings: SettingsArgs,
}

/// The query (gRPC) and admin (HTTP) ports.
#[derive(clap::Args)]
pub struct QueryArgs {
    /// gRPC query service address (PrefixIndex, health, reflection).
    #[arg(long, env = "PREFIXLOG_GRPC_ADDR", default_value = "127.0.0.1:50151")]
    pub grpc_addr: std::net::SocketAddr,
    /// Admin HTTP address (/metrics, /healthz, /readyz).
    #[arg(long, env = "PREFIXLOG_ADMIN_ADDR", default_value = "127.0.0.1:9151")]
    pub admin_addr: std::net::SocketAddr,
    /// Reported in every query response (default: the host name, else replica-<pid>).
    #[arg(long, env = "PREFIXLOG_REPLICA_ID")]
    pub replica_id: Option<String>,
    /// Ready (gRPC health SERVING, /readyz 200) once the total lag is at most this many records.
    #[arg(long, env = "PREFIXLOG_READY_LAG", default_value_t = 1000)]
    pub ready_lag: i64,
    /// Answers without a consistency token say `stale = true` once the broker has not answered
    /// for longer than this (and always while the replica is not ready). A broker outage alone
    /// does not make the replica not ready: it keeps answering from its state.
    #[arg(long, env = "PREFIXLOG_STALE_AFTER", default_value = "30s", value_parser = humantime::parse_duration)]
    pub stale_after: Duration,
    /// Serve gRPC over TLS with this certificate chain (PEM); needs --tls-key.
    #[arg(long, env = "PREFIXLOG_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The certificate's private key (PEM).
    #[arg(long, env = "PREFIXLOG_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Require client certificates signed by this CA (PEM): mutual TLS.
    #[arg(long, env = "PREFIXLOG_TLS_CLIENT_CA", requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,
}

/// Drop-in protocol facades on the query port (docs/compat/).
#[derive(clap::Args, Clone, Debug)]
pub struct SglArgs {
    /// Serve SGLang's `kv_indexer.v1.KVIndexer` on the query port for this model's keyspace
    /// (hash scheme 4, SGLang page hashes): `sgl-router --kv-indexer-endpoint` and the sgl
    /// `kv-indexer-bridge` can point at the query port. Needs --sgl-block-size. The query port
    /// then accepts log writes and fleet-wide removals (`ConfigureExpectedWorkers` with an
    /// empty list removes every SGLang worker the client may write): bind writers to their
    /// names with --writer-tokens (tokens, or certificate SANs under --tls-client-ca).
    #[arg(long, env = "PREFIXLOG_SGL_MODEL", requires = "sgl_block_size")]
    pub sgl_model: Option<String>,
    /// Tokens per page of the SGLang workers (the keyspace's block size).
    #[arg(long, env = "PREFIXLOG_SGL_BLOCK_SIZE", requires = "sgl_model", value_parser = clap::value_parser!(u32).range(1..))]
    pub sgl_block_size: Option<u32>,
    /// Serve SMG's remote radix index, `radix_index.RadixIndex`, on the query port
    /// (docs/compat/smg.md): SMG's gateway (`--kv-indexer-url http://<this>:<query port>`) and
    /// its `radix-index-bridge` (`--index`) publish and query through it. Keyspaces come from the
    /// requests (model, symbol kind, block size; wire hash scheme 1 only); holders are
    /// workers named `smg.holder`. Needs a replica of every partition (no --shard). The query
    /// port then accepts log writes: bind writers to their holders with --writer-tokens
    /// (tokens, or certificate SANs under --tls-client-ca).
    #[arg(long, env = "PREFIXLOG_SMG_RADIX_INDEX")]
    pub smg_radix_index: bool,
    /// The writers of the write facades (--sgl-model, --smg-radix-index): one a line,
    /// `TOKEN NAME-PATTERN...` or `san:NAME NAME-PATTERN...` (a name, `prefix*`, or `*`; `#`
    /// starts a comment). A write needs `authorization: Bearer TOKEN` or, under
    /// --tls-client-ca, a client certificate with a DNS or URI subject alternative name of a
    /// `san:` line, and may name only that writer's holders / workers (else UNAUTHENTICATED /
    /// PERMISSION_DENIED, counted in prefixlog_facade_skipped_total). Under --tls-client-ca
    /// without this file every write is PERMISSION_DENIED (unless
    /// --allow-unauthenticated-writes).
    #[arg(long, env = "PREFIXLOG_WRITER_TOKENS")]
    pub writer_tokens: Option<PathBuf>,
    /// Start the write facades on a query port without client authentication (no
    /// --writer-tokens, no --tls-client-ca): any client that reaches the port may then erase
    /// or overwrite any holder. Without it such a start is refused.
    #[arg(long, env = "PREFIXLOG_ALLOW_UNAUTHENTICATED_WRITES")]
    pub allow_unauthenticated_writes: bool,
    /// The largest epoch increase one SMG update may make (a larger one is refused,
    /// FAILED_PRECONDITION, reason `epoch_jump`), so no update moves a holder to an epoch
    /// nobody can supersede.
    #[arg(long, env = "PREFIXLOG_MAX_EPOCH_STEP", default_value_t = prefixlog_facades::writers::DEFAULT_MAX_EPOCH_STEP,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub max_epoch_step: u64,
    /// Most holders / workers one --writer-tokens token may write through this replica's
    /// facades (RESOURCE_EXHAUSTED past it, reason `writer_quota_holders`; a removed one frees
    /// its place); keep it below the log's --max-workers-per-partition.
    #[arg(long, env = "PREFIXLOG_WRITER_MAX_HOLDERS", default_value_t = 1_024, value_parser = clap::value_parser!(u64).range(1..))]
    pub writer_max_holders: u64,
    /// Most keyspaces (models) one --writer-tokens token may write (reason
    /// `writer_quota_keyspaces`); keep it below --max-keyspaces-per-partition.
    #[arg(long, env = "PREFIXLOG_WRITER_MAX_KEYSPACES", default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..))]
    pub writer_max_keyspaces: u64,
    /// Serve Dynamo's standalone KV indexer HTTP API (`python -m dynamo.indexer`: `/query`,
    /// `/query_by_hash`, `/workers`, `/register`, `/unregister`, `/dump`, ...) on this address,
    /// e.g. 0.0.0.0:8090 (docs/compat/dynamo-mooncake-http.md). `/register` makes this replica
    /// subscribe to the engine and write its events to the log (run it with a stable
    /// --replica-id: the registrations it accepted are its own to feed, also after a restart).
    /// Plain HTTP without authentication, even when the query port runs mTLS: bind it to a
    /// private address or put it behind a proxy that authenticates.
    #[arg(long, env = "PREFIXLOG_HTTP_INDEXER_ADDR")]
    pub http_indexer_addr: Option<std::net::SocketAddr>,
    /// The JSON the --http-indexer-addr port speaks, fixed at start (never guessed per
    /// request): `dynamo` (Dynamo's `python -m dynamo.indexer`) or `mooncake` (Mooncake
    /// conductor's `/query`: model + block_size, answers per tenant and instance; its
    /// `/query_by_hash` sequence hashes are refused with 501).
    #[arg(long, env = "PREFIXLOG_HTTP_DIALECT", default_value = "dynamo", requires = "http_indexer_addr",
          value_parser = clap::builder::PossibleValuesParser::new(["dynamo", "mooncake"])
              .try_map(|s| s.parse::<prefixlog_facades::http::Dialect>()))]
    pub http_dialect: prefixlog_facades::http::Dialect,
}

impl SglArgs {
    /// The write facades' rules; refuses a start without client authentication unless
    /// allowed (then warns, once). `client_ca`: the query port asks for client certificates.
    fn write_rules(
        &self,
        client_ca: bool,
    ) -> Result<prefixlog_facades::writers::WriteRules, prefixlog_facades::writers::WriteSurfaceError> {
        use prefixlog_facades::writers::{WriteRules, WriterPolicy};
        let quota = prefixlog_facades::writers::WriterQuota {
            holders: self.writer_max_holders as usize,
            keyspaces: self.writer_max_keyspaces as usize,
        };
        let writers = match &self.writer_tokens {
            Some(path) => WriterPolicy::load(path)?.with_quota(quota),
            None if client_ca && !self.allow_unauthenticated_writes => WriterPolicy::nobody(),
            None => WriterPolicy::Open,
        };
        let facades =
            [(self.sgl_model.is_some(), "--sgl-model"), (self.smg_radix_index, "--smg-radix-index")]
                .iter()
                .filter(|(on, _)| *on)
                .map(|(_, f)| *f)
                .collect::<Vec<_>>()
                .join(" and ");
        if !facades.is_empty() && matches!(writers, WriterPolicy::Bound(ref w, ..) if w.is_empty()) {
            tracing::warn!(
                %facades,
                "mutual TLS without --writer-tokens: no client certificate is bound to names (`san:` \
                 lines), so every write is refused with PERMISSION_DENIED"
            );
        }
        if !facades.is_empty() && self.writer_tokens.is_none() && !client_ca {
            if !self.allow_unauthenticated_writes {
                return Err(prefixlog_facades::writers::WriteSurfaceError::Unauthenticated { facades });
            }
            tracing::warn!(
                %facades,
                "--allow-unauthenticated-writes: the query port accepts log writes from any client"
            );
        }
        Ok(WriteRules { writers, max_epoch_step: self.max_epoch_step })
    }

    fn extensions(
        &self,
        spec: &prefixlog_ingest::LogSpec,
        client_ca: bool,
    ) -> anyhow::Result<prefixlog_query::Extensions> {
        use std::sync::Arc;
        let mut exts = prefixlog_query::Extensions::default();
        let rules = self.write_rules(client_ca)?;
        // The facades that write share one producer of their own.
        let writes = self.sgl_model.is_some() || self.smg_radix_index;
        let log: Option<Arc<dyn prefixlog_state::LogAppend>> =
            if writes { Some(Arc::new(prefixlog_ingest::Publisher::new(spec)?)) } else { None };
        if let (Some(model), Some(block_size), Some(log)) = (&self.sgl_model, self.sgl_block_size, &log) {
            let cfg = prefixlog_facades::sglang::SglangConfig { model: model.clone(), block_size };
            let ext =
                prefixlog_facades::sglang::SglangExtension::new(cfg, log.clone()).with_rules(rules.clone());
            exts.0.push(Arc::new(ext));
        }
        if let (true, Some(log)) = (self.smg_radix_index, &log) {
            exts.0.push(Arc::new(prefixlog_facades::smg::SmgExtension::new(log.clone()).with_rules(rules)));
        }
        if let Some(addr) = self.http_indexer_addr {
            let mut http =
                prefixlog_facades::http::HttpIndexerExtension::bind(addr)?.with_dialect(self.http_dialect);
            if self.http_dialect == prefixlog_facades::http::Dialect::Dynamo {
                // `/register`: the replica subscribes to engines and writes their events itself.
                let publisher = prefixlog_ingest::Publisher::new(spec)?;
                http = http.with_feeds(Arc::new(prefixlog::engine_feeds::BridgeFeeds::new(publisher)));
            }
            exts.0.push(Arc::new(http));
        }
        Ok(exts)
    }
}

/// The replica-to-replica side.
#[derive(clap::Args, Clone, Debug)]
pub struct PeerArgs {
    /// Address of the replica-to-replica gRPC service (digests, checkpoint transfer).
    #[arg(long, env = "PREFIXLOG_PEER_ADDR", default_value = "127.0.0.1:50152")]
    pub peer_addr: std::net::SocketAddr,
    /// Other replicas of the same shard (their --peer-addr), comma separated: compared by
    /// anti-entropy, and asked for a checkpoint when the log no longer continues a partition.
    #[arg(long, env = "PREFIXLOG_PEERS", value_delimiter = ',')]
    pub peers: Vec<String>,
    /// How often anti-entropy compares digests with every peer.
    #[arg(long, env = "PREFIXLOG_ANTI_ENTROPY_INTERVAL", default_value = "10s", value_parser = humantime::parse_duration)]
    pub anti_entropy_interval: Duration,
    /// Deadline of every call to a peer for digests, connecting included: a slow or hung peer
    /// is reported unreachable after it and never delays the comparison with the others.
    #[arg(long, env = "PREFIXLOG_PEER_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    pub peer_timeout: Duration,
    /// Checkpoint transfers this replica serves at once on its peer port (each streams in
    /// bounded chunks; a partition-filtered one is built in memory first). One more is refused
    /// with RESOURCE_EXHAUSTED, and the asking replica tries another peer or retries.
    #[arg(long, env = "PREFIXLOG_PEER_CHECKPOINT_TRANSFERS", default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..))]
    pub peer_checkpoint_transfers: u64,
    /// Scrubbing: every interval, one bounded step checking the structures that answer queries
    /// (tries, membership lists) against the digests, rotating through every keyspace; a
    /// partition they disagree on is rebuilt from a checkpoint and the log (0s disables).
    #[arg(long, env = "PREFIXLOG_SCRUB_INTERVAL", default_value = "1s", value_parser = humantime::parse_duration)]
    pub scrub_interval: Duration,
    /// Work per scrub step, in blocks, members and window segments checked (20000: about
    /// 0.2 ms of one keyspace's read lock, under 1 ms at the longest).
    #[arg(long, env = "PREFIXLOG_SCRUB_BUDGET", default_value_t = 20_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub scrub_budget: u64,
    /// With no usable local checkpoint, fetch this peer's newest first (so the log need not be
    /// retained from the beginning).
    #[arg(long, env = "PREFIXLOG_BOOTSTRAP_FROM")]
    pub bootstrap_from: Option<String>,
    /// Mutual TLS on the peer port and to peers: this replica's certificate (PEM, with both the
    /// serverAuth and clientAuth usages); needs --peer-tls-key and --peer-tls-ca.
    #[arg(long, env = "PREFIXLOG_PEER_TLS_CERT", requires_all = ["peer_tls_key", "peer_tls_ca"])]
    pub peer_tls_cert: Option<PathBuf>,
    /// The peer certificate's private key (PEM).
    #[arg(long, env = "PREFIXLOG_PEER_TLS_KEY", requires = "peer_tls_cert")]
    pub peer_tls_key: Option<PathBuf>,
    /// The CA that signs every replica's peer certificate (PEM): peers must present one.
    #[arg(long, env = "PREFIXLOG_PEER_TLS_CA", requires = "peer_tls_cert")]
    pub peer_tls_ca: Option<PathBuf>,
}

impl Args {
    fn node_options(&self) -> anyhow::Result<NodeOptions> {
        let q = &self.query;
        let p = &self.peer;
        let peer_tls = match (&p.peer_tls_cert, &p.peer_tls_key, &p.peer_tls_ca) {
            (Some(c), Some(k), Some(ca)) => Some(prefixlog_peer::PeerTls::load(c, k, ca)?),
            _ => None,
        };
        Ok(NodeOptions {
            replica_id: q.replica_id.clone().unwrap_or_else(prefixlog_query::default_replica_id),
            grpc_addr: q.grpc_addr,
            admin_addr: Some(q.admin_addr),
            peer_addr: Some(self.peer.peer_addr),
            peer_tls,
            tls: q.tls_cert.clone().zip(q.tls_key.clone()).map(|(cert, key)| prefixlog_query::TlsFiles {
                cert,
                key,
                client_ca: q.tls_client_ca.clone(),
            }),
            ready_lag: q.ready_lag,
            stale_after: q.stale_after,
            query: prefixlog_query::QueryConfig::default(),
            data_dir: self.data_dir.clone(),
            checkpoints: CheckpointPolicy {
                interval: self.checkpoint_interval,
                records: self.checkpoint_records,
                retention: Retention {
                    keep_last: self.keep_checkpoints.max(1),
                    thin_interval_ms: 3_600_000,
                    window_ms: self.keep_hourly_for.as_millis() as u64,
                },
            },
            peers: self.peer.peers.clone(),
            anti_entropy_interval: self.peer.anti_entropy_interval,
            peer_timeout: self.peer.peer_timeout,
            peer_checkpoint_transfers: self.peer.peer_checkpoint_transfers as usize,
            scrub: prefixlog_peer::ScrubOptions {
                interval: self.peer.scrub_interval,
                budget: self.peer.scrub_budget,
            },
            bootstrap_from: self.peer.bootstrap_from.clone(),
            tick_interval: self.tick_interval,
            dead_letter_topic: self.dead_letter_topic.clone(),
            gaps: if self.accept_log_gaps { GapChoice::Accept } else { GapChoice::Refuse },
            settings_change: if self.replay_on_settings_change {
                SettingsChange::Replay
            } else {
                SettingsChange::Refuse
            },
            shutdown_grace: self.shutdown_grace,
            ingest_cpus: self.ingest_cpus.clone(),
            query_copy: self.query_copy,
            extensions: prefixlog_query::Extensions::default(),
        })
    }
}

/// Resolves on SIGTERM or SIGINT (Ctrl-C).
async fn stop_signal() -> &'static str {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = tokio::signal::ctrl_c() => "SIGINT",
        },
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
            "SIGINT"
        }
    }
}

pub async fn run(a: Args) -> anyhow::Result<()> {
    let (brokers, _embedded) = a.kafka.brokers_or_embedded()?;
    let spec = a.kafka.spec(&brokers)?.with_settings(a.settings.settings()).with_shard(a.shard.clone())?;
    let (librdkafka, features) = prefixlog_ingest::connect::librdkafka_build();
    tracing::info!(librdkafka, features = %features.join(","), "kafka client");
    if a.data_dir.is_none() {
        // Here, not in the library: a deliberate choice of the demo and the tests, a likely
        // mistake of an operator.
        tracing::warn!("no --data-dir: no checkpoints; every start replays the whole log");
    }
    if let (Some(addr), Some(_)) = (a.sgl.http_indexer_addr, &a.query.tls_client_ca) {
        // mTLS on the query port suggests clients must authenticate; this port does not ask.
        tracing::warn!(
            %addr,
            "--http-indexer-addr serves plain HTTP without authentication next to an mTLS query port: \
             bind it to a private address or put it behind a proxy"
        );
    }
    let mut extensions = a.sgl.extensions(&spec, a.query.tls_client_ca.is_some())?;
    if let Some(epp) = a.epp.extension()? {
        extensions.0.push(std::sync::Arc::new(epp));
    }
    let opts = NodeOptions { extensions, ..a.node_options()? };
    let node = ReplicaNode::start(spec, opts).await?;
    let (status, engine) = (node.status().clone(), node.engine());
    let mut tick = tokio::time::interval(a.status_interval);
    let signal = stop_signal();
    tokio::pin!(signal);
    let why = loop {
        tokio::select! {
            why = &mut signal => break why,
            _ = tick.tick() => tracing::info!(
                applied = status.records_applied.load(Ordering::Relaxed),
                skipped = status.records_skipped.load(Ordering::Relaxed),
                lag = status.lag(),
                discontinuous = ?status.discontinuous(),
                apply_failed = ?status.apply_failures().iter().map(|f| (f.partition, f.offset)).collect::<Vec<_>>(),
                broker_ok = status.broker_ok.load(Ordering::Relaxed),
                keyspaces = engine.keyspace_ids().len(),
                holder_blocks = engine.holder_blocks(),
                "progress"
            ),
        }
    };
    tracing::info!(signal = why, "stopping: final checkpoint, then in-flight queries");
    // A stop must end: a wedged broker or disk must not keep the process from exiting.
    let bound = a.shutdown_grace + Duration::from_secs(60);
    match tokio::time::timeout(bound, node.shutdown()).await {
        Ok(Ok(stopped)) => {
            tracing::info!(final_checkpoint = ?stopped.final_checkpoint.map(|m| m.id), "stopped");
            Ok(())
        }
        Ok(Err(e)) => Err(e.into()),
        Err(_) => anyhow::bail!("clean stop did not finish within {bound:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::SglArgs;
    use clap::Parser;
    use prefixlog_facades::http::Dialect;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        a: SglArgs,
    }

    #[test]
    fn the_http_dialect_is_dynamo_unless_chosen_and_needs_the_port() {
        let addr = ["x", "--http-indexer-addr", "127.0.0.1:8090"];
        assert_eq!(Cli::try_parse_from(addr).unwrap().a.http_dialect, Dialect::Dynamo);
        let mooncake = Cli::try_parse_from([&addr[..], &["--http-dialect", "mooncake"]].concat()).unwrap();
        assert_eq!(mooncake.a.http_dialect, Dialect::Mooncake);
        assert!(Cli::try_parse_from([&addr[..], &["--http-dialect", "sglang"]].concat()).is_err());
        assert!(Cli::try_parse_from(["x", "--http-dialect", "mooncake"]).is_err(), "without a port");
        assert!(Cli::try_parse_from(["x"]).is_ok(), "the default needs no port");
    }

    #[test]
    fn write_facades_need_client_authentication_or_the_explicit_flag() {
        use prefixlog_facades::writers::WriterPolicy;
        let smg = Cli::try_parse_from(["x", "--smg-radix-index"]).unwrap().a;
        let err = smg.write_rules(false).unwrap_err().to_string();
        assert!(err.contains("--smg-radix-index") && err.contains("--allow-unauthenticated-writes"), "{err}");
        let mtls = smg.write_rules(true).expect("mutual TLS authenticates");
        assert!(
            matches!(mtls.writers, WriterPolicy::Bound(ref w, ..) if w.is_empty()),
            "but binds no certificate to names: every write refused"
        );
        let allowed =
            Cli::try_parse_from(["x", "--smg-radix-index", "--allow-unauthenticated-writes"]).unwrap().a;
        assert!(matches!(allowed.write_rules(false).unwrap().writers, WriterPolicy::Open));
        assert!(matches!(allowed.write_rules(true).unwrap().writers, WriterPolicy::Open));
        let dir = std::env::temp_dir().join(format!("writer-tokens-{}", std::process::id()));
        std::fs::write(&dir, "t-a gw-a\n").unwrap();
        let tokens =
            Cli::try_parse_from(["x", "--smg-radix-index", "--writer-tokens", dir.to_str().unwrap()])
                .unwrap()
                .a;
        assert!(tokens.write_rules(false).is_ok(), "tokens authenticate");
        std::fs::write(&dir, "t-a\n").unwrap();
        assert!(tokens.write_rules(false).is_err(), "a bad token file is refused");
        std::fs::remove_file(&dir).unwrap();
        let reads = Cli::try_parse_from(["x"]).unwrap().a;
        assert!(reads.write_rules(false).is_ok(), "no write facade, nothing to authenticate");
        assert!(Cli::try_parse_from(["x", "--max-epoch-step", "0"]).is_err());
    }
}
