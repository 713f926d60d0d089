//! A slow replica, not a stopped one (issue 48): the replica a gateway prefers starts taking
//! longer than the gateway's deadline to answer (a TCP proxy in front of it holds every byte it
//! sends back), while it still answers health checks in time, so the health prober keeps it in
//! the rotation. With hedging, a second replica is asked a quarter of the deadline in, and no
//! decision is made blind; without it (`IndexClient::hedging(false)`, run side by side on the
//! same replicas), the gateway waits out its deadline on the slow replica and routes blind.

use prefixlog_client::{IndexClient, MatchOutcome, MatchQuery, Prompt};
use prefixlog_engine::KeyspaceId;
use prefixlog_ingest::{EmbeddedKafka, KafkaConnection, LogSpec, Publisher};
use prefixlog_node::{NodeOptions, ReplicaNode};
use prefixlog_state::record::encode_kv_events;
use prefixlog_state::{BlockHashes, KvOp, Tier};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const P: u32 = 2;
const TOPIC: &str = "prefixlog.slow";
/// Generous for a debug build on a loaded machine; the hedge fires at a quarter of it.
const DEADLINE: Duration = Duration::from_millis(1500);
/// How late the slow replica's answers arrive: past the deadline, within the probe's timeout.
const SLOW: Duration = Duration::from_millis(2000);
/// The probe's timeout is this interval (at least 1 s): a probe through the slow proxy succeeds.
const PROBE: Duration = Duration::from_secs(3);

fn ks() -> KeyspaceId {
    KeyspaceId::new("m", 16, 1)
}

/// A TCP proxy to `upstream` that delays everything the upstream sends back by `delay_ms`
/// (read when each chunk arrives; order kept). Returns its address.
async fn delaying_proxy(upstream: SocketAddr, delay_ms: Arc<AtomicU64>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let Ok(server) = TcpStream::connect(upstream).await else { continue };
            let _ = client.set_nodelay(true);
            let _ = server.set_nodelay(true);
            let (mut client_rx, client_tx) = client.into_split();
            let (server_rx, mut server_tx) = server.into_split();
            tokio::spawn(async move {
                let _ = tokio::io::copy(&mut client_rx, &mut server_tx).await;
            });
            tokio::spawn(held_back(server_rx, client_tx, delay_ms.clone()));
        }
    });
    addr
}

/// Copies `from` to `to`, each chunk no earlier than `delay_ms` after it was read.
async fn held_back(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    delay_ms: Arc<AtomicU64>,
) {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(tokio::time::Instant, Vec<u8>)>();
    tokio::spawn(async move {
        while let Some((due, bytes)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            if to.write_all(&bytes).await.is_err() {
                return;
            }
        }
    });
    let mut buf = vec![0u8; 64 * 1024];
    while let Ok(n) = from.read(&mut buf).await {
        if n == 0 {
            return;
        }
        let due = tokio::time::Instant::now() + Duration::from_millis(delay_ms.load(Ordering::Relaxed));
        if tx.send((due, buf[..n].to_vec())).is_err() {
            return;
        }
    }
}

#[derive(Default)]
struct Seen {
    decisions: AtomicU64,
    blind: AtomicU64,
}

/// A gateway asking for the one stored prefix in a steady stream until `stop`.
async fn gateway(client: IndexClient, prompt: Vec<u64>, seen: Arc<Seen>, stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::Relaxed) {
        let q = MatchQuery::new(ks(), Prompt::Hashes(prompt.clone()));
        seen.decisions.fetch_add(1, Ordering::Relaxed);
        if let MatchOutcome::Unavailable(_) = client.match_prompt(&q).await {
            seen.blind.fetch_add(1, Ordering::Relaxed);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn start_replica(spec: &LogSpec, id: &str) -> ReplicaNode {
    let opts =
        NodeOptions { replica_id: id.into(), admin_addr: None, peer_addr: None, ..NodeOptions::default() };
    ReplicaNode::start(spec.clone(), opts).await.expect("replica starts")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hedging_answers_every_decision_while_the_preferred_replica_is_slow_and_without_it_decisions_go_blind(
) {
    let kafka = EmbeddedKafka::start(TOPIC, P).expect("embedded broker");
    let spec = LogSpec::new(KafkaConnection::new(kafka.bootstrap_servers()), TOPIC, P);
    let (slow_node, fast_node) = (start_replica(&spec, "slow").await, start_replica(&spec, "fast").await);
    // One stored prefix, applied by both replicas (no writes after: both stay equally current,
    // so the slow one, first in the list, stays the preferred one).
    let publisher = Publisher::new(&spec).unwrap();
    let blocks: Vec<BlockHashes> = (1..=4).map(|b| BlockHashes::new(b, b)).collect();
    let op = KvOp::Stored { tier: Tier::Gpu, lane: 0, parent_ext: None, blocks: blocks.clone() };
    let landed =
        publisher.publish_raw(7, &encode_kv_events(&ks(), 7, 0, 1, 1, false, &[op]), None).await.unwrap();
    for n in [&slow_node, &fast_node] {
        assert!(n.status().wait_for(&[landed.token()], Duration::from_secs(60)).await, "not applied");
    }

    let delay_ms = Arc::new(AtomicU64::new(0));
    let proxy = delaying_proxy(slow_node.grpc_addr(), delay_ms.clone()).await;
    let urls = vec![format!("http://{proxy}"), fast_node.endpoint()];
    let prompt: Vec<u64> = blocks.iter().map(|b| b.local).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let (hedged, unhedged) = (Arc::new(Seen::default()), Arc::new(Seen::default()));
    let mut gateways = Vec::new();
    for (seen, hedging) in [(&hedged, true), (&unhedged, false)] {
        let client =
            IndexClient::with_probe_interval(urls.clone(), DEADLINE, PROBE).unwrap().hedging(hedging);
        assert_eq!(client.warm_up(Duration::from_secs(10)).await, 2, "both replicas serving");
        gateways.push(tokio::spawn(gateway(client, prompt.clone(), seen.clone(), stop.clone())));
    }
    // Calm first: every decision answered, by either client.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let calm_blind = hedged.blind.load(Ordering::Relaxed) + unhedged.blind.load(Ordering::Relaxed);
    // The preferred replica turns slow (still answering, still healthy to the prober).
    delay_ms.store(SLOW.as_millis() as u64, Ordering::Relaxed);
    tokio::time::sleep(Duration::from_secs(8)).await;
    stop.store(true, Ordering::Relaxed);
    for g in gateways {
        g.await.unwrap();
    }

    let count = |s: &Seen| (s.blind.load(Ordering::Relaxed), s.decisions.load(Ordering::Relaxed));
    let ((hb, hn), (ub, un)) = (count(&hedged), count(&unhedged));
    eprintln!("slow replica: hedging on blind {hb} of {hn}; hedging off blind {ub} of {un}");
    assert_eq!(calm_blind, 0, "blind decisions before the replica turned slow");
    assert!(hn > 20, "too few hedged decisions to mean anything: {hn}");
    assert_eq!(hb, 0, "blind decisions with hedging while one replica was slow");
    // The case fails without hedging: the same replicas, the same slow one, decisions go blind.
    assert!(ub > 0, "without hedging no decision went blind: the case does not test hedging");

    drop(publisher);
    for n in [slow_node, fast_node] {
        n.shutdown().await.unwrap();
    }
    tokio::task::spawn_blocking(prefixlog_ingest::log_spec::wait_for_closing_clients).await.unwrap();
}
