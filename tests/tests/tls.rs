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
    engine.store(&ks, HolderKey::new(7, 0, 0), None, &[(1, 11), (2, 22)], 1).unwrap();
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
    let client = prefixlog_query::client::IndexClient::with_tls(
        vec![format!("https://localhost:{port}")],
        // Generous: a TLS handshake in a debug build on a loaded 2-core CI machine.
        std::time::Duration::from_secs(30),
        with_cert,
    )
    .unwrap();
    let q = prefixlog_query::client::MatchQuery::new(
        KeyspaceId::new("m", 4, 1),
        prefixlog_query::client::Prompt::Hashes(vec![11, 22, 33]),
    );
    match client.match_prompt(&q).await {
        prefixlog_query::client::MatchOutcome::Scores(a) => {
            assert_eq!(a.scores.iter().find(|s| s.worker == 7).map(|s| s.depth), Some(2))
        }
        other => panic!("gateway client over mTLS: {other:?}"),
    }
}
