//! `MatchStream` over real gRPC against an in-process server (no Kafka: the replica's progress
//! is driven by hand, so a consistency token is reached exactly when a test says so): in-band
//! errors, the original contract without them, unordered answers around a query waiting for
//! its token, the per-stream in-flight bound, and the gateway client's multiplexer and
//! streaming mode (`prefixlog-client`, which the query crate does not depend on: so the server
//! and the client meet here).

use prefixlog_client::{MuxError, StreamMux};
use prefixlog_engine::{Engine, EngineConfig, HolderKey, KeyspaceId};
use prefixlog_proto::v1::{
    match_request::Prompt, prefix_index_client::PrefixIndexClient, BlockHashes, Keyspace, MatchRequest,
    MatchResponse, PartitionOffset,
};
use prefixlog_query::tonic::{transport::Channel, Code, Streaming};
use prefixlog_query::{QueryConfig, ReplicaStatus, RunningServer, Served, ServerConfig};
use prefixlog_state::NextOffset;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;

/// A server over keyspace ("m", 4, 1) where worker 7 holds local hashes 1, 2 (2 partitions, nothing
/// applied yet).
async fn server(addr: SocketAddr, query: QueryConfig) -> (RunningServer, Arc<ReplicaStatus>) {
    try_server(addr, query).await.unwrap()
}

async fn try_server(
    addr: SocketAddr,
    query: QueryConfig,
) -> Result<(RunningServer, Arc<ReplicaStatus>), prefixlog_query::ServerError> {
    let engine = Arc::new(Engine::new(EngineConfig { partitions: 2, ..Default::default() }));
    engine
        .store(
            &KeyspaceId::new("m", 4, 1),
            HolderKey::new(7, 0, 0),
            None,
            &[(101, 1), (102, 2)].map(prefixlog_state::BlockHashes::from),
            1,
        )
        .unwrap();
    let served = Served::engine_only(engine, "r");
    let status = served.status.clone();
    let cfg = ServerConfig { grpc_addr: addr, admin_addr: None, ready_lag: 0, query, ..Default::default() };
    Ok((prefixlog_query::start(cfg, served).await?, status))
}

fn any_port() -> SocketAddr {
    ([127, 0, 0, 1], 0).into()
}

fn cfg(in_flight: usize, wait: Duration) -> QueryConfig {
    QueryConfig {
        max_in_flight_per_stream: in_flight,
        default_wait: wait,
        max_wait: wait,
        ..Default::default()
    }
}

/// A query for `hashes` (empty: invalid), optionally waiting for `token`.
fn req(id: u64, hashes: Vec<u64>, token: &[NextOffset]) -> MatchRequest {
    MatchRequest {
        keyspace: Some(Keyspace { model: "m".into(), block_size: 4, hash_scheme: 1 }),
        prompt: Some(Prompt::Hashes(BlockHashes { local: hashes })),
        min_offsets: token
            .iter()
            .map(|&NextOffset { partition, offset }| PartitionOffset { partition, offset })
            .collect(),
        request_id: id,
        ..Default::default()
    }
}

fn in_band(r: MatchRequest) -> MatchRequest {
    MatchRequest { in_band_errors: true, unordered: true, ..r }
}

async fn open(addr: SocketAddr) -> (mpsc::Sender<MatchRequest>, Streaming<MatchResponse>) {
    let mut c = PrefixIndexClient::connect(format!("http://{addr}")).await.unwrap();
    let (tx, rx) = mpsc::channel(64);
    let s = c
        .match_stream(prefixlog_query::tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    (tx, s)
}

async fn next(s: &mut Streaming<MatchResponse>) -> MatchResponse {
    s.message().await.expect("an answer, not a status").expect("the stream is open")
}

fn depth(r: &MatchResponse) -> u32 {
    r.scores.first().map_or(0, |s| s.depth)
}

/// With `in_band_errors`, a bad query gets its own error answer and the next ones are
/// answered; ordered requests keep request order.
#[tokio::test]
async fn a_bad_query_is_answered_in_band_and_the_stream_stays_open() {
    let (srv, _) = server(any_port(), cfg(32, Duration::from_secs(1))).await;
    let (tx, mut s) = open(srv.grpc_addr).await;
    let unknown = MatchRequest {
        keyspace: Some(Keyspace { model: "other".into(), block_size: 4, hash_scheme: 1 }),
        ..req(3, vec![1], &[])
    };
    for r in [req(1, vec![1, 2], &[]), req(2, vec![], &[]), unknown, req(4, vec![1], &[])] {
        tx.send(MatchRequest { in_band_errors: true, ..r }).await.unwrap();
    }
    let got: Vec<MatchResponse> =
        [next(&mut s).await, next(&mut s).await, next(&mut s).await, next(&mut s).await].into();
    assert_eq!(got.iter().map(|r| r.request_id).collect::<Vec<_>>(), vec![1, 2, 3, 4], "request order");
    assert_eq!((depth(&got[0]), got[0].error.is_none()), (2, true));
    let e = got[1].error.as_ref().expect("in-band error");
    assert_eq!((Code::from(e.code as i32), got[1].replica_id.as_str()), (Code::InvalidArgument, "r"));
    assert!(e.message.contains("empty prompt"), "{e:?}");
    assert_eq!(Code::from(got[2].error.as_ref().expect("in-band error").code as i32), Code::NotFound);
    assert_eq!((depth(&got[3]), got[3].error.is_none()), (1, true));
}

/// Without the flag, the original contract: the failed query ends the stream with its status.
#[tokio::test]
async fn without_the_flag_a_bad_query_ends_the_stream() {
    let (srv, _) = server(any_port(), cfg(32, Duration::from_secs(1))).await;
    let (tx, mut s) = open(srv.grpc_addr).await;
    for r in [req(1, vec![1, 2], &[]), req(2, vec![], &[]), req(3, vec![1], &[])] {
        tx.send(r).await.unwrap();
    }
    assert_eq!(next(&mut s).await.request_id, 1);
    let end = s.message().await.expect_err("the stream ends with the status");
    assert_eq!(end.code(), Code::InvalidArgument, "{end:?}");
}

/// A query waiting for its consistency token holds up none of the unordered answers behind it,
/// even with only two in flight: it keeps one slot, the others pass through the other.
#[tokio::test]
async fn a_query_waiting_for_its_token_holds_up_no_other_answer() {
    let (srv, status) = server(any_port(), cfg(2, Duration::from_secs(600))).await;
    let (tx, mut s) = open(srv.grpc_addr).await;
    tx.send(in_band(req(1, vec![1, 2], &[(0, 10)].map(NextOffset::from)))).await.unwrap();
    for id in 2..=6 {
        tx.send(in_band(req(id, vec![1], &[]))).await.unwrap();
    }
    for id in 2..=6 {
        let r = next(&mut s).await;
        assert_eq!((r.request_id, depth(&r)), (id, 1));
    }
    status.publish(0, 10, 0);
    let r = next(&mut s).await;
    assert_eq!((r.request_id, depth(&r), r.stale), (1, 2, false));
    assert_eq!(r.applied[0], PartitionOffset { partition: 0, offset: 10 });
}

/// At most `max_in_flight_per_stream` queries are worked on: with both slots held by tokens
/// never reached, the next query is read only once one of their waits ends (DEADLINE_EXCEEDED,
/// in band), so its answer comes after that one although it needs no wait. (The two waits end
/// a few milliseconds apart, as the two were admitted: the third query, unordered, may overtake
/// the later one, never the earlier.)
#[tokio::test]
async fn the_in_flight_bound_holds() {
    let (srv, _) = server(any_port(), cfg(2, Duration::from_secs(1))).await;
    let (tx, mut s) = open(srv.grpc_addr).await;
    tx.send(in_band(req(1, vec![1], &[(0, 10)].map(NextOffset::from)))).await.unwrap();
    tx.send(in_band(req(2, vec![1], &[(1, 10)].map(NextOffset::from)))).await.unwrap();
    tx.send(in_band(req(3, vec![1, 2], &[]))).await.unwrap();
    let first = next(&mut s).await;
    let e = first.error.as_ref().unwrap_or_else(|| panic!("answered before a slot was free: {first:?}"));
    assert!([1, 2].contains(&first.request_id), "{first:?}");
    assert_eq!(Code::from(e.code as i32), Code::DeadlineExceeded);
    let mut rest = [next(&mut s).await, next(&mut s).await];
    rest.sort_by_key(|r| r.request_id);
    let [other, third] = rest;
    let e = other.error.as_ref().unwrap_or_else(|| panic!("answered before its wait ended: {other:?}"));
    assert_eq!((other.request_id, Code::from(e.code as i32)), (3 - first.request_id, Code::DeadlineExceeded));
    assert_eq!((third.request_id, depth(&third)), (3, 2));
}

fn mux(addr: SocketAddr) -> Arc<StreamMux> {
    Arc::new(StreamMux::new(Channel::from_shared(format!("http://{addr}")).unwrap().connect_lazy()))
}

fn soon() -> Instant {
    Instant::now() + Duration::from_secs(30)
}

/// Many concurrent queries over one stream, each answered with its own result or error; those
/// waiting for a token never reached are answered last (out of the order they were sent in).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_multiplexer_routes_every_answer_to_its_caller() {
    let (srv, _) = server(any_port(), cfg(8, Duration::from_secs(1))).await;
    let m = mux(srv.grpc_addr);
    let asks: Vec<_> = (0..60u64)
        .map(|i| {
            let m = m.clone();
            let hashes = [vec![1, 2], vec![1], vec![9], vec![], vec![1, 2]][i as usize % 5].clone();
            let (token, end): (&[NextOffset], _) = match i % 5 {
                4 => {
                    (&[NextOffset { partition: 0, offset: 10 }], Instant::now() + Duration::from_millis(300))
                }
                _ => (&[], soon()),
            };
            tokio::spawn(async move { (i, m.ask(req(0, hashes, token), end).await) })
        })
        .collect();
    for a in asks {
        let (i, r) = a.await.unwrap();
        match i % 5 {
            3 => assert!(
                matches!(&r, Err(MuxError::Status { code: Code::InvalidArgument, .. })),
                "query {i}: {r:?}"
            ),
            4 => assert!(
                matches!(
                    &r,
                    Err(MuxError::Status { code: Code::DeadlineExceeded, .. }) | Err(MuxError::Timeout)
                ),
                "query {i}: {r:?}"
            ),
            k => assert_eq!(depth(&r.unwrap()), [2, 1, 0][k as usize], "query {i}"),
        }
    }
    assert_eq!((m.streams_opened(), m.in_flight()), (1, 0));
}

/// A query past its deadline times out alone: the stream stays open, its late answer is
/// dropped, and the next query is answered on the same stream. (The replica answers a token
/// wait before the query's deadline itself, so the query that times out here is one the
/// replica has not yet read: it waits behind the stream's one slot.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_past_its_deadline_times_out_and_the_stream_stays_open() {
    let (srv, status) = server(any_port(), cfg(1, Duration::from_secs(600))).await;
    let m = mux(srv.grpc_addr);
    let first = {
        let m = m.clone();
        tokio::spawn(async move { m.ask(req(0, vec![1, 2], &[(0, 10)].map(NextOffset::from)), soon()).await })
    };
    queued(&m, &first).await;
    let late = m.ask(req(0, vec![1], &[]), Instant::now() + Duration::from_millis(200)).await;
    assert_eq!(late, Err(MuxError::Timeout));
    status.publish(0, 10, 0);
    let r = first.await.unwrap().expect("answered once the token is reached");
    assert_eq!((depth(&r), r.stale), (2, false));
    // The late answer (depth 1) is sent after the first one, to nobody.
    let r = m.ask(req(0, vec![1, 2], &[]), soon()).await.expect("answered");
    assert_eq!(depth(&r), 2);
    assert_eq!((m.streams_opened(), m.in_flight()), (1, 0));
}

/// Waits until the query `task` asks is queued on `m`'s stream; fails if the task ended first
/// (its send failed) instead of spinning.
async fn queued<T>(m: &StreamMux, task: &tokio::task::JoinHandle<T>) {
    while m.in_flight() == 0 {
        assert!(!task.is_finished(), "the query ended before it was queued");
        tokio::task::yield_now().await;
    }
}

/// A server on a runtime of its own: shutting the runtime down drops every connection at once
/// (a crash). Returns its address and progress.
async fn crashable(rt: &tokio::runtime::Runtime, query: QueryConfig) -> (SocketAddr, Arc<ReplicaStatus>) {
    rt.spawn(async move {
        let (srv, status) = server(any_port(), query).await;
        let addr = srv.grpc_addr;
        std::mem::forget(srv); // lives as long as the runtime
        (addr, status)
    })
    .await
    .unwrap()
}

/// A server again on `addr` once the crashed one has let the port go: `shutdown_background`
/// drops the old listener on the runtime's own thread, so the first bind may still find the
/// port taken (seen once in CI). Retries for at most 10 s.
async fn restart_on(addr: SocketAddr, query: QueryConfig) -> RunningServer {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match try_server(addr, query.clone()).await {
            Ok((srv, _)) => return srv,
            Err(e) if Instant::now() < deadline => {
                eprintln!("rebinding {addr}: {e}; retrying");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("the port stayed taken for 10 s: {e}"),
        }
    }
}

/// The stream breaks with a query pending: it fails with a retriable error (not a timeout),
/// and the next query opens a new stream to the replica that came back on the same address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_stream_fails_pending_queries_and_the_next_query_reconnects() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let (addr, _) = crashable(&rt, cfg(32, Duration::from_secs(600))).await;
    let m = mux(addr);
    assert_eq!(depth(&m.ask(req(0, vec![1, 2], &[]), soon()).await.unwrap()), 2);
    let pending = {
        let m = m.clone();
        tokio::spawn(async move { m.ask(req(0, vec![1], &[(0, 10)].map(NextOffset::from)), soon()).await })
    };
    queued(&m, &pending).await;
    rt.shutdown_background();
    let e = pending.await.unwrap().expect_err("the stream broke");
    assert!(matches!(e, MuxError::Broken(_)) && e.is_retriable(), "{e:?}");
    let _srv = restart_on(addr, cfg(32, Duration::from_secs(1))).await;
    let r = m.ask(req(0, vec![1, 2], &[]), soon()).await.expect("a new stream");
    assert_eq!(depth(&r), 2);
    assert_eq!(m.streams_opened(), 2);
}

/// A request's own `timeout_us` bounds its token wait as a unary call's deadline does: a token
/// never reached gives a stale answer (`allow_stale`) or DEADLINE_EXCEEDED in band, although
/// the replica's default wait is long.
#[tokio::test]
async fn a_query_s_own_timeout_bounds_its_token_wait() {
    let (srv, _) = server(any_port(), cfg(32, Duration::from_secs(600))).await;
    let (tx, mut s) = open(srv.grpc_addr).await;
    let own = |r: MatchRequest| MatchRequest { timeout_us: 200_000, ..in_band(r) };
    tx.send(own(MatchRequest { allow_stale: true, ..req(1, vec![1, 2], &[(0, 10)].map(NextOffset::from)) }))
        .await
        .unwrap();
    let r = next(&mut s).await;
    assert_eq!((r.request_id, depth(&r), r.stale, r.error), (1, 2, true, None));
    tx.send(own(req(2, vec![1, 2], &[(0, 10)].map(NextOffset::from)))).await.unwrap();
    let r = next(&mut s).await;
    assert_eq!((r.request_id, r.error.map(|e| Code::from(e.code as i32))), (2, Some(Code::DeadlineExceeded)));
}

/// `IndexClient::streaming(true)`: the same outcomes as unary calls, over one stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_index_client_streams_when_asked() {
    use prefixlog_client::{IndexClient, MatchOutcome, MatchQuery, Prompt, Unavailable};
    let (srv, _) = server(any_port(), cfg(32, Duration::from_secs(1))).await;
    let c = IndexClient::new(vec![format!("http://{}", srv.grpc_addr)], Duration::from_secs(5))
        .unwrap()
        .streaming(true);
    let q = MatchQuery::new(KeyspaceId::new("m", 4, 1), Prompt::Hashes(vec![1, 2]));
    match c.match_prompt(&q).await {
        MatchOutcome::Scores(a) => assert_eq!((a.scores[0].worker, a.scores[0].depth), (7, 2)),
        other => panic!("{other:?}"),
    }
    let q = MatchQuery::new(KeyspaceId::new("other", 4, 1), Prompt::Hashes(vec![1]));
    match c.match_prompt(&q).await {
        MatchOutcome::Unavailable(Unavailable::Rejected { code, .. }) => assert_eq!(code, Code::NotFound),
        other => panic!("{other:?}"),
    }
}

/// Forwards connections to `to`, except the first: read until the client's first HTTP/2
/// HEADERS frame (a call is on the wire), then closed. Returns the proxy's address.
async fn dropping_first_call(to: SocketAddr) -> SocketAddr {
    use tokio::io::AsyncReadExt;
    let listener = tokio::net::TcpListener::bind(any_port()).await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut first, _) = listener.accept().await.unwrap();
        let mut preface = [0u8; 24];
        first.read_exact(&mut preface).await.unwrap();
        loop {
            let mut head = [0u8; 9];
            first.read_exact(&mut head).await.unwrap();
            let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
            first.read_exact(&mut vec![0u8; len]).await.unwrap();
            if head[3] == 0x1 {
                break drop(first);
            }
        }
        while let Ok((mut client, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut replica = tokio::net::TcpStream::connect(to).await.unwrap();
                let _ = tokio::io::copy_bidirectional(&mut client, &mut replica).await;
            });
        }
    });
    addr
}

/// Opening a stream sends no query, so an open that fails on a connection that dies under it
/// (what a restarted replica's old connection does to the first call the channel makes on it
/// before noticing) is tried again: the query is answered, not failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_that_fails_on_a_dead_connection_is_tried_again() {
    let (srv, _) = server(any_port(), cfg(32, Duration::from_secs(1))).await;
    let m = mux(dropping_first_call(srv.grpc_addr).await);
    let r = m.ask(req(0, vec![1, 2], &[]), soon()).await.expect("answered on the second connection");
    assert_eq!((depth(&r), m.streams_opened()), (2, 1));
}
