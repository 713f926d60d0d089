//! The query port over TLS and mutual TLS (no Kafka needed: the engine is written directly).
//!
//! Certificates: `tests/fixtures/tls/` (throwaway, 100-year validity), made with
//! `openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 ...` for the CA and
//! CA-signed server (SAN localhost, 127.0.0.1, serverAuth) and client (clientAuth) certificates.

use prefixlog_engine::{Engine, EngineConfig, HolderKey, KeyspaceId};
use prefixlog_proto::v1::{
    self, match_request::Prompt, prefix_index_client::PrefixIndexClient, MatchRequest,
};
use prefixlog_query::{ServerConfig, TlsFiles};
use prefixlog_state::BlockHashes;
use std::path::PathBuf;
use std::sync::Arc;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/tls").join(name)
}

fn pem(name: &str) -> Vec<u8> {
    std::fs::read(fixture(name)).unwrap()
}

async fn server(client_ca: bool) -> prefixlog_query::RunningServer {
    let engine = Arc::new(Engine::new(EngineConfig::default()));
    let ks = KeyspaceId::new("m", 4, 1);
    engine.store(&ks, HolderKey::new(7, 0, 0), None, &[(1, 11), (2, 22)].map(BlockHashes::from), 1).unwrap();
    let cfg = ServerConfig {
        grpc_addr: ([127, 0, 0, 1], 0).into(),
        admin_addr: None,
        ready_lag: i64::MAX,
        tls: Some(TlsFiles {
            cert: fixture("server.pem"),
            key: fixture("server.key"),
            client_ca: client_ca.then(|| fixture("ca.pem")),
        }),
        ..Default::default()
    };
    prefixlog_query::start(cfg, prefixlog_query::Served::engine_only(engine, "tls")).await.unwrap()
}

async fn depth(ch: Channel) -> Result<u32, tonic::Status> {
    let r = PrefixIndexClient::new(ch)
        .r#match(MatchRequest {
            keyspace: Some(v1::Keyspace { model: "m".into(), block_size: 4, hash_scheme: 1 }),
            prompt: Some(Prompt::Hashes(v1::BlockHashes { local: vec![11, 22, 33] })),
            ..Default::default()
        })
        .await?
        .into_inner();
    Ok(r.scores.iter().find(|s| s.worker == 7).map_or(0, |s| s.depth))
}

async fn channel(port: u16, tls: Option<ClientTlsConfig>) -> Result<Channel, tonic::transport::Error> {
    let scheme = if tls.is_some() { "https" } else { "http" };
    let mut ep = Channel::from_shared(format!("{scheme}://localhost:{port}")).unwrap();
    if let Some(t) = tls {
        ep = ep.tls_config(t)?;
    }
    ep.connect().await
}

fn trusting_ca() -> ClientTlsConfig {
    ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pem("ca.pem"))).domain_name("localhost")
}

#[tokio::test]
async fn tls_serves_trusting_clients_and_refuses_plaintext() {
    let s = server(false).await;
    let port = s.grpc_addr.port();
    let ch = channel(port, Some(trusting_ca())).await.unwrap();
    assert_eq!(depth(ch).await.unwrap(), 2);
    // A plaintext client cannot talk to a TLS port.
    let plain = match channel(port, None).await {
        Ok(ch) => depth(ch).await.is_err(),
        Err(_) => true,
    };
    assert!(plain, "plaintext request must fail against the TLS port");
}

#[tokio::test]
async fn mtls_requires_a_client_certificate_from_the_ca() {
    let s = server(true).await;
    let port = s.grpc_addr.port();
    let no_cert = match channel(port, Some(trusting_ca())).await {
        Ok(ch) => depth(ch).await.is_err(),
        Err(_) => true,
    };
    assert!(no_cert, "a client without a certificate is refused");
    let with_cert = trusting_ca().identity(Identity::from_pem(pem("client.pem"), pem("client.key")));
    let ch = channel(port, Some(with_cert.clone())).await.unwrap();
    assert_eq!(depth(ch).await.unwrap(), 2);
    // The gateway client over mTLS.
    let client = prefixlog_client::IndexClient::with_tls(
        vec![format!("https://localhost:{port}")],
        // Generous: a TLS handshake in a debug build on a loaded 2-core CI machine.
        std::time::Duration::from_secs(30),
        with_cert,
    )
    .unwrap();
    let q = prefixlog_client::MatchQuery::new(
        KeyspaceId::new("m", 4, 1),
        prefixlog_client::Prompt::Hashes(vec![11, 22, 33]),
    );
    match client.match_prompt(&q).await {
        prefixlog_client::MatchOutcome::Scores(a) => {
            assert_eq!(a.scores.iter().find(|s| s.worker == 7).map(|s| s.depth), Some(2))
        }
        other => panic!("gateway client over mTLS: {other:?}"),
    }
}

/// Mutual TLS on the peer port: a replica bootstraps from a peer and compares digests with it
/// over TLS; a replica without the peer certificate is refused (reported unreachable, never a
/// divergence), and so is a checkpoint transfer to a client with no certificate or one of
/// another CA, and a bootstrap without the certificate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_port_over_mutual_tls() {
    use prefixlog_engine::KeyspaceId;
    use prefixlog_ingest::{EmbeddedKafka, KafkaConnection, LogSpec, Publisher};
    use prefixlog_node::{CheckpointPolicy, NodeOptions, ReplicaNode, StateSource};
    use prefixlog_peer::PeerTls;
    use prefixlog_state::{token_of, KvOp, StateSettings, Tier};
    use std::time::Duration;
    let kafka = EmbeddedKafka::start("prefixlog.peer-tls", 2).unwrap();
    let settings = StateSettings { digest_interval: 2, ..Default::default() };
    let spec = LogSpec::new(KafkaConnection::new(kafka.bootstrap_servers()), "prefixlog.peer-tls", 2)
        .with_settings(settings);
    let tls = PeerTls::load(&fixture("peer.pem"), &fixture("peer.key"), &fixture("ca.pem")).unwrap();
    let opts = |name: &str, dir: &std::path::Path| NodeOptions {
        replica_id: name.into(),
        admin_addr: None,
        data_dir: Some(dir.to_path_buf()),
        peer_tls: Some(tls.clone()),
        checkpoints: CheckpointPolicy { interval: Duration::ZERO, records: 0, ..Default::default() },
        anti_entropy_interval: Duration::from_secs(3600),
        ..NodeOptions::default()
    };
    let publisher = Publisher::new(&spec).unwrap();
    let mut landed = Vec::new();
    for w in 0..8u64 {
        let ops = [KvOp::Stored {
            tier: Tier::Gpu,
            lane: 0,
            parent_ext: None,
            blocks: [(w << 8 | 1, 1)].map(BlockHashes::from).to_vec(),
        }];
        landed.push(
            publisher
                .publish_kv_events(&KeyspaceId::new("m", 4, 1), w, 0, 1, 1, false, &ops, None)
                .await
                .unwrap(),
        );
    }
    let token = token_of(&landed);
    let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = ReplicaNode::start(spec.clone(), opts("a", da.path())).await.unwrap();
    assert!(a.status().wait_for(&token, Duration::from_secs(30)).await);
    a.checkpoint_now().unwrap();
    let peer = a.peer_addr().unwrap().to_string();
    let ob =
        NodeOptions { bootstrap_from: Some(peer.clone()), peers: vec![peer.clone()], ..opts("b", db.path()) };
    let b = ReplicaNode::start(spec.clone(), ob).await.unwrap();
    assert!(matches!(b.source(), StateSource::Peer { .. }), "bootstrapped over TLS: {:?}", b.source());
    // More records: both record digest points at the same offsets from here on.
    for w in 0..8u64 {
        let ops = [KvOp::Stored {
            tier: Tier::Gpu,
            lane: 0,
            parent_ext: Some(w << 8 | 1),
            blocks: [(w << 8 | 2, 2)].map(BlockHashes::from).to_vec(),
        }];
        landed.push(
            publisher
                .publish_kv_events(&KeyspaceId::new("m", 4, 1), w, 0, 1, 2, false, &ops, None)
                .await
                .unwrap(),
        );
    }
    let token = token_of(&landed);
    for n in [&a, &b] {
        assert!(n.status().wait_for(&token, Duration::from_secs(30)).await);
    }
    let r = b.anti_entropy_round().await.unwrap();
    assert!(r.compared > 0 && r.unreachable.is_empty() && r.mismatches.is_empty(), "{r:?}");
    // Without the peer certificate: refused by the peer port.
    let dc = tempfile::tempdir().unwrap();
    let oc = NodeOptions { peer_tls: None, peers: vec![format!("https://{peer}")], ..opts("c", dc.path()) };
    let c = ReplicaNode::start(spec.clone(), oc).await.unwrap();
    let r = c.anti_entropy_round().await.unwrap();
    assert_eq!((r.compared, r.unreachable.len()), (0, 1), "{r:?}");
    // The checkpoint stream (the whole index) is refused to a client that trusts the CA but
    // presents no certificate, or one signed by another CA; given to a replica's certificate.
    use prefixlog_peer::PeerClient;
    use tonic::transport::{Certificate, ClientTlsConfig, Identity};
    let trusting =
        ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pem("ca.pem"))).domain_name("localhost");
    let foreign = trusting.clone().identity(Identity::from_pem(pem("other-peer.pem"), pem("other-peer.key")));
    for (who, tls) in [("no certificate", trusting), ("another CA's certificate", foreign)] {
        let e = PeerClient::with_tls(Some(tls)).fetch_export(&peer, &[]).await;
        assert!(e.is_err(), "{who}: the checkpoint must be refused");
    }
    let whole = PeerClient::with_tls(Some(tls.client())).fetch_export(&peer, &[]).await.unwrap();
    assert!(!whole.is_empty());
    // A replica without the certificate cannot bootstrap from the peer either.
    let dd = tempfile::tempdir().unwrap();
    let od = NodeOptions {
        peer_tls: None,
        bootstrap_from: Some(format!("https://{peer}")),
        ..opts("d", dd.path())
    };
    assert!(ReplicaNode::start(spec, od).await.is_err(), "no bootstrap without the peer certificate");
}
