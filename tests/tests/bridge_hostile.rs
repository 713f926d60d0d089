//! The bridge's hostile drill in process (issue 50), on every Kafka backend of the run and
//! without Python: one `bridge::run` serves two stand-in engines (`prefixlog_tests::zmtp_pub`, a
//! ZMTP PUB in Rust) and four raw TCP "engines" that repeat an attack on every connection the
//! bridge makes — after the handshake a frame header declaring 2^62 bytes, an HTTP answer to the
//! greeting, endless empty MORE frames, a frame stalled a few bytes in that answers no
//! heartbeat. Each attack ends its connection for its reason, again and again, the engines'
//! connections are never dropped (their heartbeats are answered), and both engines' blocks keep
//! reaching the replica. The upstream leg runs the same drill against the `prefixlog bridge`
//! process with vLLM's own publisher and bounds its memory (tests/upstream/test_bridge_hostile.py).

use prefixlog_bridge::metrics::BridgeMetrics;
use prefixlog_bridge::{self as bridge, BridgeOptions, EngineSpec};
use prefixlog_engine::scheme::block_hashes;
use prefixlog_engine::{HolderKey, KeyspaceId, MatchOptions};
use prefixlog_ingest::Publisher;
use prefixlog_node::ReplicaNode;
use prefixlog_tests::zmtp_pub::StandInPub;
use prefixlog_tests::{kafka_backends, replicas, unique_topic};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const P: u32 = 2;
const BS: u32 = 4;

fn ks() -> KeyspaceId {
    KeyspaceId::new("hostile", BS, 1)
}

/// One stand-in engine: each batch stores one new root block.
struct Engine {
    publisher: StandInPub,
    worker: u64,
    seq: u64,
}

impl Engine {
    async fn bind(worker: u64) -> Self {
        Self { publisher: StandInPub::bind().await.unwrap(), worker, seq: 0 }
    }

    fn tokens(&self, seq: u64) -> Vec<u32> {
        let base = (self.worker * 1_000_000 + seq * BS as u64) as u32;
        (base..base + BS).collect()
    }

    /// Publishes the next batch (lost if nobody is subscribed yet: a gap the bridge closes by
    /// starting the worker over); returns its tokens.
    async fn publish(&mut self) -> Vec<u32> {
        use rmpv::Value;
        let tokens = self.tokens(self.seq);
        let stored = Value::Array(vec![
            "BlockStored".into(),
            Value::Array(vec![Value::from(self.worker * 1_000_000 + self.seq)]),
            Value::Nil,
            Value::Array(tokens.iter().map(|&t| Value::from(t)).collect()),
            Value::from(BS),
            Value::Nil,
        ]);
        let batch = Value::Array(vec![Value::F64(0.0), Value::Array(vec![stored]), Value::from(0)]);
        let mut payload = Vec::new();
        rmpv::encode::write_value(&mut payload, &batch).unwrap();
        self.publisher.send(&[b"", &self.seq.to_be_bytes(), &payload]).await;
        self.seq += 1;
        tokens
    }
}

/// The depth the replica credits `worker` with for `tokens`.
fn depth(r: &ReplicaNode, worker: u64, tokens: &[u32]) -> u32 {
    let a = r.applier().lock();
    let q = block_hashes(tokens, BS as usize);
    let found = a.engine().match_chain(&ks(), &q, &MatchOptions::default()).unwrap_or_default();
    found.iter().find(|m| m.holder == HolderKey::new(worker, 0, 0)).map_or(0, |m| m.depth)
}

#[derive(Clone, Copy, Debug)]
enum Attack {
    HugeFrame,
    Garbage,
    EndlessMore,
    Stall,
}

/// A listener running `attack` on every connection; its endpoint.
async fn hostile(attack: Attack) -> String {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("tcp://{}", l.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((tcp, _)) = l.accept().await {
            tokio::spawn(async move {
                let _ = run_attack(tcp, attack).await;
            });
        }
    });
    endpoint
}

async fn run_attack(mut tcp: TcpStream, attack: Attack) -> std::io::Result<()> {
    if let Attack::Garbage = attack {
        tcp.write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n").await?;
    } else {
        // ZMTP 3.1, NULL: our greeting, theirs, their READY, our READY as a PUB (37/ZMTP).
        let greeting = [&[0xFF, 0, 0, 0, 0, 0, 0, 0, 0, 0x7F, 3, 1][..], b"NULL", &[0; 48]].concat();
        tcp.write_all(&greeting).await?;
        tcp.read_exact(&mut [0; 64]).await?;
        let mut head = [0u8; 2];
        tcp.read_exact(&mut head).await?;
        tcp.read_exact(&mut vec![0; head[1] as usize]).await?;
        let body = [&[5][..], b"READY", &[11], b"Socket-Type", &[0, 0, 0, 3], b"PUB"].concat();
        tcp.write_all(&[&[0x04, body.len() as u8][..], &body].concat()).await?;
    }
    match attack {
        Attack::HugeFrame => tcp.write_all(&[0x02, 0x40, 0, 0, 0, 0, 0, 0, 0]).await?,
        Attack::EndlessMore => loop {
            tcp.write_all(&[0x01, 0].repeat(4096)).await?;
        },
        Attack::Stall => tcp.write_all(&[0x02, 0, 0, 0, 0, 0, 0x10, 0, 0, 1, 2, 3]).await?,
        Attack::Garbage => {}
    }
    // Reads (and never answers) whatever comes, until the bridge closes the connection.
    let mut sink = [0u8; 1024];
    while tcp.read(&mut sink).await? > 0 {}
    Ok(())
}

fn sum(ms: &[Arc<BridgeMetrics>], name: &str) -> u64 {
    ms.iter().map(|m| m.get(name).unwrap_or(0)).sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_endpoints_leave_the_other_feeds_flowing() {
    let mut ran = Vec::new();
    for b in kafka_backends().await {
        let topic = unique_topic("prefixlog.bridge-hostile");
        b.create_topic(&topic, P).await.unwrap();
        let spec = replicas::spec(&b.brokers, &topic, P);
        let r = replicas::replica(&spec, "bridge-hostile").await;
        let (mut e1, mut e2) = (Engine::bind(1).await, Engine::bind(2).await);
        let attacks =
            [(11, Attack::HugeFrame), (12, Attack::Garbage), (13, Attack::EndlessMore), (14, Attack::Stall)];
        let stream = |endpoint: String, worker| EngineSpec {
            endpoint,
            replay_endpoint: None,
            worker,
            dp_rank: None,
            topic: String::new(),
        };
        let mut engines =
            vec![stream(e1.publisher.endpoint().into(), 1), stream(e2.publisher.endpoint().into(), 2)];
        for (worker, attack) in attacks {
            engines.push(stream(hostile(attack).await, worker));
        }
        let mut opts = BridgeOptions::new(ks());
        (opts.heartbeat_interval, opts.heartbeat_timeout) =
            (Duration::from_millis(100), Duration::from_millis(500));
        opts.log_interval = Duration::ZERO;
        let exported = Arc::new(bridge::metrics::BridgeCollector::default());
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let running = tokio::spawn({
            let (exported, publisher) = (exported.clone(), Publisher::new(&spec).unwrap());
            async move { bridge::run(engines, opts, publisher, false, stop_rx, &exported).await }
        });
        let of = |w| exported.of_worker(w);

        // 1. Both engines flow: a batch of each is held.
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let (t1, t2) = (e1.publish().await, e2.publish().await);
            tokio::time::sleep(Duration::from_millis(50)).await;
            if depth(&r, 1, &t1) == 1 && depth(&r, 2, &t2) == 1 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{}: the engines' first blocks never reached the replica",
                b.name
            );
        }
        // 2. They keep publishing until every attack has ended its connection twice.
        let from = (e1.seq, e2.seq);
        let reasons = [
            (11, "disconnects_oversized"),
            (12, "disconnects_protocol"),
            (13, "disconnects_oversized"),
            (14, "disconnects_timeout"),
        ];
        let deadline = Instant::now() + Duration::from_secs(90);
        while !reasons.iter().all(|(w, reason)| sum(&of(*w), reason) >= 2) {
            e1.publish().await;
            e2.publish().await;
            tokio::time::sleep(Duration::from_millis(50)).await;
            let seen = reasons.map(|(w, reason)| (w, sum(&of(w), reason)));
            assert!(Instant::now() < deadline, "{}: attacks not all ended twice: {seen:?}", b.name);
        }
        e1.publish().await;
        e2.publish().await;
        // 3. Every batch published during and after the attacks is held: nothing lost.
        let missing =
            |e: &Engine, from: u64| (from..e.seq).filter(|&s| depth(&r, e.worker, &e.tokens(s)) != 1).count();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let (m1, m2) = (missing(&e1, from.0), missing(&e2, from.1));
            if (m1, m2) == (0, 0) {
                break;
            }
            let published = (e1.seq - from.0, e2.seq - from.1);
            assert!(Instant::now() < deadline, "{}: batches not held (of {published:?}): {m1}, {m2}", b.name);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        for (w, _) in attacks {
            let m = of(w);
            assert_eq!(sum(&m, "messages_received"), 0, "{}: worker {w}", b.name);
            assert!(sum(&m, "reconnects") >= 2, "{}: worker {w}", b.name);
        }
        assert!(
            sum(&of(11), "messages_oversized") >= 2 && sum(&of(13), "messages_oversized") >= 2,
            "{}",
            b.name
        );
        for w in [1, 2] {
            let disconnects: u64 = ["oversized", "protocol", "timeout", "closed"]
                .iter()
                .map(|r| sum(&of(w), &format!("disconnects_{r}")))
                .sum();
            assert_eq!(disconnects, 0, "{}: engine {w}'s connection was dropped", b.name);
        }
        stop_tx.send(true).unwrap();
        tokio::time::timeout(Duration::from_secs(30), running)
            .await
            .expect("the bridge stops")
            .unwrap()
            .unwrap();
        ran.push(b.name);
    }
    eprintln!("[kafka backend] ran: {ran:?}");
}
