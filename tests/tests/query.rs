//! The query service end to end over real gRPC and Kafka (every available backend): exact
//! scores for events of several workers, read-your-writes through a placement's consistency
//! token, a documented status for every bad input, health and readiness, the admin port, and
//! client failover when a replica dies.

use prefixlog_client::{IndexClient, MatchOutcome, MatchQuery, Prompt, Unavailable};
use prefixlog_engine::scheme::block_hashes;
use prefixlog_engine::{Engine, EngineConfig, HolderKey, KeyspaceId};
use prefixlog_ingest::Publisher;
use prefixlog_node::{NodeOptions, ReplicaNode};
use prefixlog_proto::v1::{
    self, match_request::Prompt as PbPrompt, prefix_index_client::PrefixIndexClient, MatchRequest,
};
use prefixlog_query::tonic::{self, Code};
use prefixlog_query::tonic_health::pb::{
    health_check_response::ServingStatus, health_client::HealthClient, HealthCheckRequest,
};
use prefixlog_query::{QueryConfig, ReplicaStatus, ServerConfig};
use prefixlog_state::BlockHashes;
use prefixlog_state::NextOffset;
use prefixlog_state::{token_of, KvOp, Landed, Tier};
use prefixlog_tests::http::http_get;
use prefixlog_tests::{kafka_backends, replicas, unique_topic, KafkaBackend};
use std::sync::Arc;
use std::time::{Duration, Instant};

const P: u32 = 4;
const BS: u32 = 4;

fn ks() -> KeyspaceId {
    KeyspaceId::new("m", BS, 1)
}

/// The prompt every test queries: 8 full blocks and a partial one.
fn prompt() -> Vec<u32> {
    (100..134).collect()
}

fn query_cfg() -> QueryConfig {
    QueryConfig {
        max_blocks: 64,
        max_decoding_message_size: 64 << 10,
        max_concurrent_streams: 2,
        ..Default::default()
    }
}

/// A replica with small query limits, ready at lag 0.
fn node_opts(id: &str) -> NodeOptions {
    NodeOptions { ready_lag: 0, query: query_cfg(), peer_addr: None, ..replicas::options(id) }
}

async fn replica_with_server(b: &KafkaBackend, topic: &str, id: &str) -> ReplicaNode {
    ReplicaNode::start(replicas::spec(&b.brokers, topic, P), node_opts(id)).await.expect("replica starts")
}

/// A replica's query server on its own runtime: [`Killable::kill`] shuts the runtime down,
/// which drops every connection task at once — a crash, not a graceful shutdown.
struct Killable {
    id: String,
    addr: std::net::SocketAddr,
    status: Arc<ReplicaStatus>,
    rt: Option<tokio::runtime::Runtime>,
}

impl Killable {
    async fn start(b: &KafkaBackend, topic: &str, id: &str) -> Self {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let (spec, opts) =
            (replicas::spec(&b.brokers, topic, P), NodeOptions { admin_addr: None, ..node_opts(id) });
        let node = rt.spawn(async move {
            let n = ReplicaNode::start(spec, opts).await.expect("replica starts");
            let (addr, status) = (n.grpc_addr(), n.status().clone());
            // Keep the replica alive as long as its runtime.
            std::mem::forget(n);
            (addr, status)
        });
        let (addr, status) = node.await.unwrap();
        Self { id: id.into(), addr, status, rt: Some(rt) }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn kill(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }

    /// Kills the server and waits (up to 10 s) until its port refuses connections: the
    /// runtime's tasks are dropped asynchronously, and a fixed sleep is a race on a loaded
    /// machine.
    async fn kill_and_wait_closed(&mut self) {
        self.kill();
        let t = Instant::now();
        while tokio::net::TcpStream::connect(self.addr).await.is_ok() {
            assert!(t.elapsed() < Duration::from_secs(10), "{} still accepts connections", self.id);
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Drop for Killable {
    fn drop(&mut self) {
        self.kill();
    }
}

fn url(s: &ReplicaNode) -> String {
    s.endpoint()
}

/// Publishes one stored chain for `worker` (ext hashes derived from the worker, locals given).
async fn store(p: &Publisher, worker: u64, dp: u32, seq: u64, parent: Option<u64>, locals: &[u64]) -> Landed {
    let blocks: Vec<BlockHashes> = locals
        .iter()
        .enumerate()
        .map(|(i, &l)| (worker * 1000 + seq * 100 + i as u64, l))
        .map(BlockHashes::from)
        .collect();
    p.publish_kv_events(
        &ks(),
        worker,
        dp,
        1,
        seq,
        false,
        &[KvOp::Stored { tier: Tier::Gpu, lane: 0, parent_ext: parent, blocks }],
        None,
    )
    .await
    .expect("publish")
}

/// Workers 1..=5 with known holdings of the prompt's blocks. Returns the landed records.
async fn publish_workers(p: &Publisher) -> Vec<Landed> {
    let l = block_hashes(&prompt(), BS as usize);
    assert_eq!(l.len(), 8);
    let mut landed = vec![
        store(p, 1, 0, 1, None, &l).await,                                   // all 8
        store(p, 2, 0, 1, None, &l[..3]).await,                              // 3
        store(p, 3, 0, 1, None, &l[..5]).await, // 5, then block 2 removed: depth 2
        store(p, 4, 0, 1, None, &block_hashes(&[7; 16], BS as usize)).await, // unrelated
        store(p, 5, 1, 1, None, &l[..1]).await, // dp rank 1: 1
    ];
    let removed = KvOp::Removed { tier: Tier::Gpu, lane: 0, exts: vec![3 * 1000 + 100 + 2] };
    landed.push(p.publish_kv_events(&ks(), 3, 0, 1, 2, false, &[removed], None).await.unwrap());
    landed
}

/// A consistency token as [`ReplicaStatus::wait_for`] takes it.
fn offsets(landed: &[Landed]) -> Vec<NextOffset> {
    token_of(landed)
}

fn tok(landed: &[Landed]) -> Vec<v1::PartitionOffset> {
    token_of(landed)
        .into_iter()
        .map(|NextOffset { partition, offset }| v1::PartitionOffset { partition, offset })
        .collect()
}

fn req(prompt: PbPrompt) -> MatchRequest {
    MatchRequest {
        keyspace: Some(v1::Keyspace { model: "m".into(), block_size: BS, hash_scheme: 1 }),
        prompt: Some(prompt),
        ..Default::default()
    }
}

fn tokens(ids: Vec<u32>) -> PbPrompt {
    PbPrompt::Tokens(v1::TokenIds { ids, ..Default::default() })
}

fn hashes(local: Vec<u64>) -> PbPrompt {
    PbPrompt::Hashes(v1::BlockHashes { local })
}

/// (worker, dp, depth, total, inferred) of every score.
fn summary(r: &v1::MatchResponse) -> Vec<(u64, u32, u32, u32, bool)> {
    r.scores.iter().map(|s| (s.worker, s.dp_rank, s.depth, s.total_blocks, s.inferred)).collect()
}

async fn serving(addr: &str) -> ServingStatus {
    let ch = tonic::transport::Endpoint::from_shared(addr.to_string()).unwrap().connect().await.unwrap();
    let mut h = HealthClient::new(ch);
    let r = h.check(HealthCheckRequest { service: "prefixlog.v1.PrefixIndex".into() }).await.unwrap();
    ServingStatus::try_from(r.into_inner().status).unwrap()
}

async fn wait_serving(addr: &str, want: ServingStatus) {
    let t = Instant::now();
    while serving(addr).await != want {
        // Generous: CI is a loaded 2-core machine.
        assert!(t.elapsed() < Duration::from_secs(60), "{addr} never became {want:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scores_read_your_writes_and_statuses() {
    let mut ran = Vec::new();
    for b in kafka_backends().await {
        let topic = unique_topic("prefixlog.query");
        b.create_topic(&topic, P).await.unwrap();
        let publisher = Publisher::new(&replicas::spec(&b.brokers, &topic, P)).unwrap();
        let server = replica_with_server(&b, &topic, "r1").await;
        let landed = publish_workers(&publisher).await;
        let mut c = PrefixIndexClient::connect(url(&server)).await.unwrap();
        let l = block_hashes(&prompt(), BS as usize);

        // Exact scores, by tokens (hashed by the replica) and by precomputed hashes.
        let mut q = req(tokens(prompt()));
        q.min_offsets = tok(&landed);
        q.request_id = 42;
        // The replica has just started consuming: allow its token wait 10 s (the default is
        // 1 s, too little on a loaded 2-core CI machine).
        let mut q = tonic::Request::new(q);
        q.set_timeout(Duration::from_secs(10));
        let r = c.r#match(q).await.unwrap().into_inner();
        let want = vec![(1, 0, 8, 8, false), (3, 0, 2, 4, false), (2, 0, 3, 3, false), (5, 1, 1, 1, false)];
        let mut want_sorted = want.clone();
        want_sorted.sort_by(|a, b| b.2.cmp(&a.2).then(a.0.cmp(&b.0)));
        assert_eq!(summary(&r), want_sorted, "{}", b.name);
        assert_eq!((r.request_id, r.query_blocks, r.replica_id.as_str(), r.stale), (42, 8, "r1", false));
        assert_eq!(r.applied.len(), P as usize);
        for t in &landed {
            assert!(r.applied[t.partition as usize].offset > t.offset, "answer reflects the record");
        }
        let r2 = c.r#match(req(hashes(l.clone()))).await.unwrap().into_inner();
        assert_eq!(summary(&r2), want_sorted);
        // Intervals show worker 3's hole; top-k cuts; lane filter.
        let mut qi = req(hashes(l.clone()));
        qi.intervals = true;
        let ri = c.r#match(qi).await.unwrap().into_inner();
        let w3 = ri.scores.iter().find(|s| s.worker == 3).unwrap();
        let iv: Vec<(u32, u32)> = w3.intervals.iter().map(|i| (i.start, i.end)).collect();
        assert_eq!(iv, [(0, 2), (3, 5)]);
        let mut qk = req(hashes(l.clone()));
        qk.top_k = Some(2);
        assert_eq!(summary(&c.r#match(qk).await.unwrap().into_inner()), want_sorted[..2].to_vec());
        let mut ql = req(hashes(l.clone()));
        ql.lane = Some(1);
        assert!(c.r#match(ql).await.unwrap().into_inner().scores.is_empty());
        // A prompt shorter than one block is valid and matches nothing.
        let short = c.r#match(req(tokens(vec![1, 2]))).await.unwrap().into_inner();
        assert_eq!((short.query_blocks, short.scores.len()), (0, 0));

        // Read-your-writes: publish a placement, query right away with its token.
        let client = IndexClient::new(vec![url(&server)], Duration::from_secs(5)).unwrap();
        let ks = ks();
        let place =
            |ks, n| publisher.publish_placement(ks, HolderKey::new(9, 0, 0), &l[..n], &[], "gw-test", None);
        let landed_p = place(&ks, 6).await.unwrap();
        let out = client
            .match_prompt(&MatchQuery::new(ks.clone(), Prompt::Tokens(prompt())).after(&[landed_p]))
            .await;
        let MatchOutcome::Scores(a) = out else { panic!("{}: {out:?}", b.name) };
        let w9 = a.scores.iter().find(|s| s.worker == 9).expect("placement visible");
        assert_eq!((w9.depth, w9.inferred), (6, true));
        // Also when the placement creates the keyspace: the wait comes before the lookup.
        let fresh = KeyspaceId::new(unique_topic("fresh"), BS, 1);
        let landed_f = place(&fresh, 2).await.unwrap();
        let out =
            client.match_prompt(&MatchQuery::new(fresh, Prompt::Hashes(l.clone())).after(&[landed_f])).await;
        let MatchOutcome::Scores(a) = out else { panic!("{}: {out:?}", b.name) };
        assert_eq!((a.scores[0].worker, a.scores[0].depth), (9, 2));

        // A token the replica cannot reach in time: DEADLINE_EXCEEDED, or stale if allowed.
        let far = vec![v1::PartitionOffset { partition: 0, offset: 1_000_000 }];
        let mut qf = req(hashes(l.clone()));
        qf.min_offsets = far.clone();
        let mut rq = tonic::Request::new(qf.clone());
        rq.set_timeout(Duration::from_millis(200));
        let t = Instant::now();
        // The server answers DEADLINE_EXCEEDED a margin before the deadline, but on a loaded
        // machine the client's own timer may still fire first (CANCELLED): either way it timed
        // out without an answer.
        let code = c.r#match(rq).await.unwrap_err().code();
        assert!(matches!(code, Code::DeadlineExceeded | Code::Cancelled), "{code:?}");
        assert!(t.elapsed() < Duration::from_secs(2), "waited about the request deadline");
        // allow_stale without a client timer to race: the server's wait is bounded by its own
        // default (1 s), then it answers stale; the outer timeout only guards against a hang.
        qf.allow_stale = true;
        let rs = tokio::time::timeout(Duration::from_secs(30), c.r#match(qf))
            .await
            .expect("a stale answer after the server's default wait")
            .unwrap()
            .into_inner();
        assert!(rs.stale && !rs.scores.is_empty());

        check_bad_inputs(&mut c, &l).await;
        check_streams(&server).await;

        // Health and readiness after catch-up; reflection lists the services.
        wait_serving(&url(&server), ServingStatus::Serving).await;
        let admin = server.admin_addr().unwrap();
        assert_eq!(http_get(admin, "/healthz").await.0, 200);
        let (code, body) = http_get(admin, "/readyz").await;
        assert_eq!(code, 200, "{body}");
        let (code, m) = http_get(admin, "/metrics").await;
        assert_eq!(code, 200);
        for metric in [
            "prefixlog_query_latency_seconds_count",
            "prefixlog_queries_total{code=\"INVALID_ARGUMENT\",shard=\"all\"}",
            "prefixlog_partition_lag{partition=\"0\",shard=\"all\"}",
            "prefixlog_records_applied_total{shard=\"all\"}",
            "prefixlog_keyspaces{shard=\"all\"} 2",
            "prefixlog_holders{shard=\"all\"} 7",
            "prefixlog_holder_blocks",
            "prefixlog_match_depth_blocks_bucket",
            "prefixlog_ready{shard=\"all\"} 1",
            "process_resident_memory_bytes",
        ] {
            assert!(m.contains(metric), "{metric} missing from /metrics:\n{m}");
        }
        ran.push(b.name);
    }
    eprintln!("[kafka backend] ran: {ran:?}");
}

async fn check_bad_inputs(c: &mut PrefixIndexClient<tonic::transport::Channel>, l: &[u64]) {
    let status = |r: Result<tonic::Response<v1::MatchResponse>, tonic::Status>| r.unwrap_err();
    let ks = |model: &str, bs: u32, scheme: u32| {
        Some(v1::Keyspace { model: model.into(), block_size: bs, hash_scheme: scheme })
    };
    let cases: Vec<(&str, MatchRequest, Code, &str)> = vec![
        (
            "top_k 0",
            MatchRequest { top_k: Some(0), ..req(hashes(l.to_vec())) },
            Code::InvalidArgument,
            "top_k",
        ),
        (
            "no keyspace",
            MatchRequest { keyspace: None, ..req(hashes(l.to_vec())) },
            Code::InvalidArgument,
            "keyspace",
        ),
        (
            "block size 0",
            MatchRequest { keyspace: ks("m", 0, 1), ..req(hashes(l.to_vec())) },
            Code::InvalidArgument,
            "block_size",
        ),
        (
            "unknown model",
            MatchRequest { keyspace: ks("x", BS, 1), ..req(hashes(l.to_vec())) },
            Code::NotFound,
            "m/bs4/scheme1",
        ),
        (
            "wrong block size",
            MatchRequest { keyspace: ks("m", 16, 1), ..req(tokens(prompt())) },
            Code::NotFound,
            "2 known",
        ),
        (
            "unknown scheme, tokens",
            MatchRequest { keyspace: ks("m", BS, 7), ..req(tokens(prompt())) },
            Code::InvalidArgument,
            "scheme 7",
        ),
        (
            "unknown scheme, hashes",
            MatchRequest { keyspace: ks("m", BS, 7), ..req(hashes(l.to_vec())) },
            Code::NotFound,
            "scheme7",
        ),
        (
            "no prompt",
            MatchRequest { prompt: None, ..req(hashes(vec![])) },
            Code::InvalidArgument,
            "empty prompt",
        ),
        ("empty tokens", req(tokens(vec![])), Code::InvalidArgument, "empty prompt"),
        ("empty hashes", req(hashes(vec![])), Code::InvalidArgument, "empty prompt"),
        ("too many hashes", req(hashes(vec![1; 65])), Code::InvalidArgument, "limit is 64"),
        ("too many tokens", req(tokens(vec![1; 65 * BS as usize])), Code::InvalidArgument, "limit is 64"),
        (
            "token partition out of range",
            MatchRequest {
                min_offsets: vec![v1::PartitionOffset { partition: P, offset: 0 }],
                ..req(hashes(l.to_vec()))
            },
            Code::InvalidArgument,
            "partition",
        ),
        // 10k hashes ≈ 90 kB > the 64 KiB decoding limit: refused before decoding.
        ("message too large", req(hashes(vec![u64::MAX; 10_000])), Code::ResourceExhausted, "too large"),
    ];
    for (name, r, code, msg) in cases {
        let s = status(c.r#match(r).await);
        assert_eq!(s.code(), code, "{name}: {s:?}");
        assert!(s.message().contains(msg), "{name}: message {:?} should mention {msg:?}", s.message());
    }
}

async fn check_streams(server: &ReplicaNode) {
    let mut c = PrefixIndexClient::connect(url(server)).await.unwrap();
    let l = block_hashes(&prompt(), BS as usize);
    // Two streams (the configured limit) are served; a third is refused.
    let (tx1, rx1) = tokio::sync::mpsc::channel::<MatchRequest>(8);
    let (_tx2, rx2) = tokio::sync::mpsc::channel::<MatchRequest>(8);
    let (_tx3, rx3) = tokio::sync::mpsc::channel::<MatchRequest>(8);
    let mut s1 = c.match_stream(tokio_stream(rx1)).await.unwrap().into_inner();
    let _s2 = c.match_stream(tokio_stream(rx2)).await.unwrap().into_inner();
    let e = c.match_stream(tokio_stream(rx3)).await.unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    for id in 1..=3u64 {
        tx1.send(MatchRequest { request_id: id, ..req(hashes(l.clone())) }).await.unwrap();
        let r = s1.message().await.unwrap().unwrap();
        assert_eq!((r.request_id, r.scores[0].worker, r.scores[0].depth), (id, 1, 8));
    }
    // A bad request ends the stream with its status.
    tx1.send(req(hashes(vec![]))).await.unwrap();
    assert_eq!(s1.message().await.unwrap_err().code(), Code::InvalidArgument);
}

fn tokio_stream<T>(
    rx: tokio::sync::mpsc::Receiver<T>,
) -> prefixlog_query::tokio_stream::wrappers::ReceiverStream<T> {
    prefixlog_query::tokio_stream::wrappers::ReceiverStream::new(rx)
}

/// Health and readiness follow the lag, both ways, over a hand-driven status (no Kafka needed
/// to make the replica lag on demand).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_follows_lag() {
    use std::sync::atomic::Ordering;
    let served = prefixlog_query::Served::engine_only(Arc::new(Engine::new(EngineConfig::default())), "r");
    let status = served.status.clone();
    let cfg = ServerConfig {
        grpc_addr: ([127, 0, 0, 1], 0).into(),
        admin_addr: Some(([127, 0, 0, 1], 0).into()),
        ready_lag: 10,
        query: query_cfg(),
        ..Default::default()
    };
    let server = prefixlog_query::start(cfg, served).await.unwrap();
    let addr = format!("http://{}", server.grpc_addr);
    let admin = server.admin_addr.unwrap();
    status.partitions[0].high_watermark.store(5_000, Ordering::Release);
    status.partitions[0].watermarks_known.store(true, Ordering::Release);
    wait_serving(&addr, ServingStatus::NotServing).await;
    let (code, body) = http_get(admin, "/readyz").await;
    assert_eq!(code, 503);
    assert!(body.contains("lag 5000"), "{body}");
    status.publish(0, 4_995, 0); // lag 5 ≤ 10
    wait_serving(&addr, ServingStatus::Serving).await;
    assert_eq!(http_get(admin, "/readyz").await.0, 200);
    status.partitions[0].high_watermark.store(9_000, Ordering::Release); // falls behind again
    wait_serving(&addr, ServingStatus::NotServing).await;
    assert_eq!(http_get(admin, "/healthz").await.0, 200, "liveness is not readiness");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_fails_over_within_one_deadline() {
    let mut ran = Vec::new();
    for b in kafka_backends().await {
        let topic = unique_topic("prefixlog.failover");
        b.create_topic(&topic, P).await.unwrap();
        let publisher = Publisher::new(&replicas::spec(&b.brokers, &topic, P)).unwrap();
        let sa = Killable::start(&b, &topic, "a").await;
        let sb = Killable::start(&b, &topic, "b").await;
        let landed = publish_workers(&publisher).await;
        // Both replicas applied everything, so no answer below waits on the token.
        for s in [&sa, &sb] {
            let ok = s.status.wait_for(&offsets(&landed), Duration::from_secs(30)).await;
            assert!(ok, "{}: replica {} never applied the records", b.name, s.id);
        }
        // Debug builds on a shared, loaded 2-core machine: a generous deadline (same mechanism
        // as 2 ms), so the live replica's half of it covers a new channel and an answer under
        // load, and a second of slack on the timings below, still less than a whole second
        // deadline spent on a hung endpoint.
        let deadline = Duration::from_secs(4);
        let slack = Duration::from_secs(1);
        let client =
            IndexClient::with_probe_interval(vec![sa.url(), sb.url()], deadline, Duration::from_millis(50))
                .unwrap();
        wait_serving(&sa.url(), ServingStatus::Serving).await;
        wait_serving(&sb.url(), ServingStatus::Serving).await;
        let t = Instant::now();
        while client.healthy_endpoints().len() < 2 {
            assert!(t.elapsed() < Duration::from_secs(60), "client never saw both replicas healthy");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let q = MatchQuery::new(ks(), Prompt::Tokens(prompt())).after(&landed);
        let first = match client.match_with_deadline(&q, Duration::from_secs(5)).await {
            MatchOutcome::Scores(a) => a,
            o => panic!("{}: {o:?}", b.name),
        };
        // A hung endpoint (the kernel accepts connections, nobody answers) listed first: it
        // costs its share of the deadline, then the live replica answers in time.
        let hole = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let hung =
            IndexClient::new(vec![format!("http://{}", hole.local_addr().unwrap()), sa.url()], deadline)
                .unwrap();
        let t = Instant::now();
        let out = hung.match_prompt(&q).await;
        let took = t.elapsed();
        assert!(matches!(&out, MatchOutcome::Scores(a) if a.replica_id == sa.id), "{}: {out:?}", b.name);
        assert!(took < deadline + slack, "took {took:?}");
        let (mut victim, mut other) = if first.replica_id == sa.id { (sa, sb) } else { (sb, sa) };
        victim.kill_and_wait_closed().await;
        let t = Instant::now();
        let out = client.match_prompt(&q).await;
        let took = t.elapsed();
        match out {
            MatchOutcome::Scores(a) => {
                assert_eq!(a.replica_id, other.id, "answered by the surviving replica");
                assert_eq!(a.scores[0].depth, 8);
            }
            o => panic!("{}: no failover: {o:?}", b.name),
        }
        assert!(took < deadline + slack, "failover took {took:?}, deadline {deadline:?}");
        // Unknown keyspace: a fail-open outcome, not an error.
        let bad = MatchQuery::new(KeyspaceId::new("nope", BS, 1), Prompt::Hashes(vec![1]));
        assert!(matches!(
            client.match_prompt(&bad).await,
            MatchOutcome::Unavailable(Unavailable::Rejected { code: Code::NotFound, .. })
        ));
        // Every replica gone: Unavailable, quickly.
        other.kill_and_wait_closed().await;
        let t = Instant::now();
        let out = client.match_prompt(&q).await;
        assert!(matches!(out, MatchOutcome::Unavailable(_)), "{out:?}");
        assert!(t.elapsed() <= deadline + slack, "took {:?}", t.elapsed());
        ran.push(b.name);
    }
    eprintln!("[kafka backend] ran: {ran:?}");
}

/// Gateway integration over gRPC: a candidate filter, gapped holders flagged and excludable,
/// `ListWorkers` with the metadata of `WorkerAdded`, and a consistency token passed from one
/// replica's answer to another replica unchanged is reached there (one unit: next offsets).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn candidates_gaps_workers_and_token_round_trip() {
    use prefixlog_state::Lifecycle;
    let mut ran = Vec::new();
    for b in kafka_backends().await {
        let topic = unique_topic("prefixlog.gateway");
        b.create_topic(&topic, P).await.unwrap();
        let spec = replicas::spec(&b.brokers, &topic, P);
        let publisher = Publisher::new(&spec).unwrap();
        let (ra, rb) =
            (replica_with_server(&b, &topic, "a").await, replica_with_server(&b, &topic, "b").await);
        let l = block_hashes(&prompt(), BS as usize);
        let chain: Vec<BlockHashes> =
            l.iter().enumerate().map(|(i, &h)| (1000 + i as u64, h)).map(BlockHashes::from).collect();
        let stored = |w: u64| KvOp::Stored {
            tier: Tier::Gpu,
            lane: 0,
            parent_ext: None,
            blocks: chain.iter().map(|b| BlockHashes::new(b.ext + w * 100, b.local)).collect(),
        };
        let meta: std::collections::BTreeMap<String, String> =
            [("pod".to_string(), "worker-3".to_string())].into();
        let mut landed = vec![
            publisher.publish_kv_events(&ks(), 1, 0, 1, 1, false, &[stored(1)], None).await.unwrap(),
            // Worker 2's stream lost a batch (seq 1 → 3): gapped.
            publisher.publish_kv_events(&ks(), 2, 0, 1, 1, false, &[], None).await.unwrap(),
            publisher.publish_kv_events(&ks(), 2, 0, 1, 3, false, &[stored(2)], None).await.unwrap(),
            publisher.publish_lifecycle(3, &Lifecycle::Added { metadata: meta.clone() }).await.unwrap(),
            publisher.publish_kv_events(&ks(), 3, 0, 1, 1, false, &[stored(3)], None).await.unwrap(),
        ];
        landed.sort();
        for r in [&ra, &rb] {
            assert!(r.status().wait_for(&offsets(&landed), Duration::from_secs(30)).await, "{}", b.name);
        }
        let mut c = PrefixIndexClient::connect(url(&ra)).await.unwrap();
        let workers =
            |r: &v1::MatchResponse| r.scores.iter().map(|s| (s.worker, s.gapped)).collect::<Vec<_>>();
        let all = c.r#match(req(hashes(l.clone()))).await.unwrap().into_inner();
        assert_eq!(workers(&all), vec![(1, false), (2, true), (3, false)], "{}", b.name);
        let only = MatchRequest { candidate_workers: vec![3, 1, 99], ..req(hashes(l.clone())) };
        assert_eq!(workers(&c.r#match(only).await.unwrap().into_inner()), vec![(1, false), (3, false)]);
        let no_gaps = MatchRequest { exclude_gapped: true, top_k: Some(1), ..req(hashes(l.clone())) };
        assert_eq!(
            workers(&c.r#match(no_gaps).await.unwrap().into_inner()),
            vec![(1, false)],
            "top-k after the filter"
        );
        let listed = c.list_workers(v1::ListWorkersRequest {}).await.unwrap().into_inner();
        assert_eq!(listed.workers.len(), 1, "{}: {listed:?}", b.name);
        assert_eq!(
            (listed.workers[0].worker, listed.workers[0].metadata.get("pod").map(String::as_str)),
            (3, Some("worker-3"))
        );
        // a's `applied`, unchanged, as b's token: reached (nothing more is published). A replica
        // that read it as one record more would wait for a record that never comes and answer
        // DEADLINE_EXCEEDED within the deadline, so an answer is the proof (no clock read).
        let mut q = req(hashes(l.clone()));
        q.min_offsets = all.applied.clone();
        let mut rq = tonic::Request::new(q);
        rq.set_timeout(Duration::from_secs(5));
        let r = PrefixIndexClient::connect(url(&rb)).await.unwrap().r#match(rq).await;
        let r = r
            .unwrap_or_else(|s| panic!("{}: b waited for a record that never comes: {s:?}", b.name))
            .into_inner();
        assert!(!r.stale, "{}", b.name);
        assert_eq!(r.applied, all.applied, "{}", b.name);
        ran.push(b.name);
    }
    eprintln!("[kafka backend] ran: {ran:?}");
}
