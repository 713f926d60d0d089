//! Sharded discovery through one name that stands for every replica (issue 35: a headless
//! Kubernetes Service), on every available backend.
//!
//! Four replicas of one log — shard 0/2 on 127.0.0.11 and .12, shard 1/2 on .13 and .14, all on
//! one port, over TLS with a certificate that names `localhost` only — and a resolver that
//! answers `localhost` with the four addresses, as a headless Service's DNS name answers with
//! its pods. The Rust client discovering from the one seed `https://localhost:PORT` must ask
//! every address (the certificate checked against the seed's name, not the address), find both
//! shards and answer with workers of both, never partial. The same seed resolving to shard 0's
//! replicas only — what a Service with a cluster IP gives, one pod per connection — leaves
//! shard 1 unknown: discovery says the layout is incomplete instead of answering half.

use prefixlog_client::seeds::{static_resolver, Resolver};
use prefixlog_client::{DiscoveryError, IndexClient, MatchOutcome, MatchQuery, Prompt};
use prefixlog_engine::{partition_of, KeyspaceId};
use prefixlog_ingest::{KafkaConnection, LogSpec, Publisher, Shard};
use prefixlog_node::{NodeOptions, ReplicaNode};
use prefixlog_query::TlsFiles;
use prefixlog_state::BlockHashes;
use prefixlog_state::{token_of, KvOp, Tier};
use prefixlog_tests::{kafka_backends, listen_port, unique_topic};
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;
use tonic::transport::{Certificate, ClientTlsConfig};

const P: u32 = 4;
const WORKERS: u64 = 8;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/tls").join(name)
}

fn ks() -> KeyspaceId {
    KeyspaceId::new("m", 4, 1)
}

async fn replica(spec: &LogSpec, shard: &str, ip: &str, port: u16) -> ReplicaNode {
    let spec = spec.clone().with_shard(shard.parse::<Shard>().unwrap()).unwrap();
    let opts = NodeOptions {
        replica_id: format!("{shard}@{ip}"),
        grpc_addr: format!("{ip}:{port}").parse().unwrap(),
        admin_addr: None,
        ready_lag: 0,
        tls: Some(TlsFiles { cert: fixture("server.pem"), key: fixture("server.key"), client_ca: None }),
        ..NodeOptions::default()
    };
    ReplicaNode::start(spec, opts).await.unwrap()
}

fn resolver(ips: &[&str]) -> Resolver {
    let ips: Vec<IpAddr> = ips.iter().map(|a| a.parse().unwrap()).collect();
    static_resolver(BTreeMap::from([("localhost".to_string(), ips)]))
}

fn tls() -> ClientTlsConfig {
    ClientTlsConfig::new().ca_certificate(Certificate::from_pem(std::fs::read(fixture("ca.pem")).unwrap()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_name_for_every_replica_discovers_every_shard() {
    let mut ran = Vec::new();
    for b in kafka_backends().await {
        let topic = unique_topic("prefixlog.discovery");
        b.create_topic(&topic, P).await.unwrap();
        let spec = LogSpec::new(KafkaConnection::new(&b.brokers), topic, P);
        let publisher = Publisher::new(&spec).unwrap();
        let mut landed = Vec::new();
        for w in 0..WORKERS {
            let ops = [KvOp::Stored {
                tier: Tier::Gpu,
                lane: 0,
                parent_ext: None,
                blocks: [(w << 8 | 1, w << 8 | 1), (w << 8 | 2, w << 8 | 2)].map(BlockHashes::from).to_vec(),
            }];
            landed.push(publisher.publish_kv_events(&ks(), w, 0, 1, 1, false, &ops, None).await.unwrap());
        }
        let shards_of_workers: std::collections::BTreeSet<u32> =
            (0..WORKERS).map(|w| partition_of(w, P) % 2).collect();
        assert_eq!(shards_of_workers.len(), 2, "the workers must live in both shards");
        let port = listen_port();
        let nodes = [
            replica(&spec, "0/2", "127.0.0.11", port).await,
            replica(&spec, "0/2", "127.0.0.12", port).await,
            replica(&spec, "1/2", "127.0.0.13", port).await,
            replica(&spec, "1/2", "127.0.0.14", port).await,
        ];
        let token = token_of(&landed);
        for n in &nodes {
            assert!(n.status().wait_for(&token, Duration::from_secs(60)).await, "{}", b.name);
            let t = std::time::Instant::now();
            while !n.ready().0 {
                assert!(t.elapsed() < Duration::from_secs(60), "{}: not ready: {}", b.name, n.ready().1);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        let seed = vec![format!("https://localhost:{port}")];

        let every = resolver(&["127.0.0.11", "127.0.0.12", "127.0.0.13", "127.0.0.14"]);
        let client = IndexClient::discover_with(seed.clone(), Duration::from_secs(5), Some(tls()), every)
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", b.name));
        let layout = client.shards();
        assert_eq!(layout.len(), 2, "{}: {layout:?}", b.name);
        assert_eq!(layout[0].0, vec![0, 2]);
        assert_eq!(layout[1].0, vec![1, 3]);
        for (_, endpoints) in &layout {
            assert_eq!(endpoints.len(), 2, "{}: every replica of the shard: {layout:?}", b.name);
        }
        // Every worker holds blocks 1, 2 under its own hashes: a query per worker, each answered
        // by its own shard, none partial.
        for w in 0..WORKERS {
            let q = MatchQuery::new(ks(), Prompt::Hashes(vec![w << 8 | 1, w << 8 | 2]));
            match client.match_prompt(&q).await {
                MatchOutcome::Scores(a) => {
                    assert!(!a.partial, "{}: {a:?}", b.name);
                    assert_eq!((a.scores[0].worker, a.scores[0].depth), (w, 2), "{}: {a:?}", b.name);
                }
                other => panic!("{}: worker {w}: {other:?}", b.name),
            }
        }

        // A name that reaches shard 0 only (a cluster IP: one pod per connection).
        let half = resolver(&["127.0.0.11", "127.0.0.12"]);
        match IndexClient::discover_with(seed, Duration::from_secs(5), Some(tls()), half).await {
            Err(DiscoveryError::Incomplete { seeds: 1, asked: 2, answered: 2 }) => {}
            Err(e) => panic!("{}: {e}", b.name),
            Ok(c) => panic!("{}: discovered {:?} from half of the replicas", b.name, c.shards()),
        }
        for n in nodes {
            n.shutdown().await.unwrap();
        }
        ran.push(b.name);
    }
    eprintln!("[discovery] backends run: {ran:?}");
}
