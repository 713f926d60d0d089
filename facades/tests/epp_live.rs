//! The GIE endpoint picker end to end: embedded Kafka, a replica serving the picker on ports of
//! its own, records published with the ingest Publisher, and the test playing Envoy's part on
//! the ext_proc stream with the client generated from the upstream schema
//! (proto/proto/compat/envoy). The fake workers are only `ip:port` serving URLs in worker
//! metadata: nothing listens there, the picker only names them.

use prefixlog_engine::{scheme, KeyspaceId};
use prefixlog_facades::epp::pb::envoy::config::core::v3::{HeaderMap, HeaderValue, Metadata};
use prefixlog_facades::epp::pb::external_processor_client::ExternalProcessorClient;
use prefixlog_facades::epp::pb::processing_request::Request as Msg;
use prefixlog_facades::epp::pb::processing_response::Response as Reply;
use prefixlog_facades::epp::pb::*;
use prefixlog_facades::epp::tokenize::Tokenizers;
use prefixlog_facades::epp::{EppConfig, EppExtension, Limits};
use prefixlog_ingest::{EmbeddedKafka, KafkaConnection, LogSpec, Publisher};
use prefixlog_node::{NodeOptions, ReplicaNode};
use prefixlog_query::tonic_health::pb::{
    health_check_response, health_client::HealthClient, HealthCheckRequest,
};
use prefixlog_query::Extensions;
use prefixlog_state::record::{KvOp, Lifecycle, Tier};
use prefixlog_state::token_of;
use prefixlog_state::BlockHashes;
use prost_types::{value::Kind, ListValue, Struct, Value};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tonic::Streaming;

const BLOCK: u32 = 4;
const MAX_BODY: usize = 256 << 10;

/// A WordLevel tokenizer over `w0`..`w63` split on whitespace, built in code and saved as the
/// `tokenizer.json` the picker loads: "w3 w7" is token ids [3, 7].
fn tokenizer_file(name: &str) -> PathBuf {
    use tokenizers::models::wordlevel::WordLevel;
    use tokenizers::pre_tokenizers::whitespace::Whitespace;
    let mut vocab: std::collections::HashMap<String, u32> = (0..64).map(|i| (format!("w{i}"), i)).collect();
    vocab.insert("[UNK]".into(), 64);
    let model =
        WordLevel::builder().vocab(vocab.into_iter().collect()).unk_token("[UNK]".into()).build().unwrap();
    let mut t = tokenizers::Tokenizer::new(model);
    t.with_pre_tokenizer(Some(Whitespace {}));
    let dir = std::env::temp_dir().join(format!("prefixlog-epp-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("tokenizer.json");
    t.save(&path, false).unwrap();
    path
}

fn words(ids: std::ops::Range<u32>) -> String {
    ids.map(|i| format!("w{i}")).collect::<Vec<_>>().join(" ")
}

fn endpoint(i: u64) -> String {
    format!("10.0.0.{i}:8000")
}

/// A replica with the picker on free ports; `ready_lag` -1: never ready.
async fn start(
    topic: &str,
    ready_lag: i64,
    max_streams: usize,
) -> (EmbeddedKafka, LogSpec, ReplicaNode, Arc<EppExtension>) {
    start_with(topic, ready_lag, max_streams, Duration::from_secs(30)).await
}

async fn start_with(
    topic: &str,
    ready_lag: i64,
    max_streams: usize,
    message_timeout: Duration,
) -> (EmbeddedKafka, LogSpec, ReplicaNode, Arc<EppExtension>) {
    let kafka = EmbeddedKafka::start(topic, 2).unwrap();
    let spec = LogSpec::new(KafkaConnection::new(kafka.bootstrap_servers()), topic, 2);
    let (node, ext) = replica(&spec, topic, ready_lag, max_streams, message_timeout).await;
    (kafka, spec, node, ext)
}

/// A replica of `spec`'s log with the picker on free ports.
async fn replica(
    spec: &LogSpec,
    name: &str,
    ready_lag: i64,
    max_streams: usize,
    message_timeout: Duration,
) -> (ReplicaNode, Arc<EppExtension>) {
    let tokenizers = Tokenizers::load(&[("llama".into(), tokenizer_file(name))]).unwrap();
    // A generous index timeout: a slow index on a loaded machine must not turn into a fail-open.
    let timeout = Duration::from_secs(30);
    let limits = Limits { max_body_bytes: MAX_BODY, index_timeout: timeout, max_streams, message_timeout };
    let cfg = EppConfig { tokenizers, limits, ..Default::default() };
    let any = "127.0.0.1:0".parse().unwrap();
    let ext = Arc::new(EppExtension::bind(any, any, cfg).unwrap());
    let opts = NodeOptions {
        replica_id: name.into(),
        ready_lag,
        extensions: Extensions(vec![ext.clone()]),
        ..Default::default()
    };
    (ReplicaNode::start(spec.clone(), opts).await.unwrap(), ext)
}

/// Workers `(id, model)` serving at `10.0.0.<id>:8000`, and `(worker, blocks of token ids)`.
async fn publish(spec: &LogSpec, node: &ReplicaNode, workers: &[(u64, &str)], held: &[(u64, Vec<u32>)]) {
    let p = Publisher::new(spec).unwrap();
    let ks = KeyspaceId::new("llama", BLOCK, 1);
    let mut landed = Vec::new();
    for &(w, model) in workers {
        let url = format!("http://{}", endpoint(w));
        let meta = [(prefixlog_bridge::META_SERVING_URL.to_string(), url), ("model".into(), model.into())];
        let added = Lifecycle::Added { metadata: meta.into_iter().collect() };
        landed.push(p.publish_lifecycle(w, &added).await.unwrap());
    }
    // Each worker's feed numbered from 1 without holes (a hole would mark it gapped, and the
    // picker asks with exclude_gapped).
    let mut seq: std::collections::HashMap<u64, u64> = Default::default();
    for (w, tokens) in held {
        let chain = scheme::block_hashes(tokens, BLOCK as usize);
        let ops = [KvOp::Stored {
            tier: Tier::Gpu,
            lane: 0,
            parent_ext: None,
            blocks: chain.iter().map(|&l| (l, l)).map(BlockHashes::from).collect(),
        }];
        let s = seq.entry(*w).or_default();
        *s += 1;
        landed.push(p.publish_kv_events(&ks, *w, 0, 1, *s, false, &ops, None).await.unwrap());
    }
    assert!(node.status().wait_for(&token_of(&landed), Duration::from_secs(60)).await);
}

async fn health(ext: &EppExtension, service: &str) -> health_check_response::ServingStatus {
    let channel =
        Channel::from_shared(format!("http://{}", ext.health_addr())).unwrap().connect().await.unwrap();
    let mut c = HealthClient::new(channel);
    let r = c.check(HealthCheckRequest { service: service.into() }).await.unwrap().into_inner();
    r.status()
}

/// Readiness is a state, not a time: ask until it is reached (counted tries, so a picker that
/// never gets ready fails instead of hanging).
async fn wait_ready(ext: &EppExtension) {
    for _ in 0..6000 {
        if health(ext, "readiness").await == health_check_response::ServingStatus::Serving {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the picker's readiness never became SERVING");
}

/// Envoy's side of one `Process` stream.
struct Envoy {
    tx: mpsc::Sender<ProcessingRequest>,
    rx: Streaming<ProcessingResponse>,
}

/// What the picker answered for a request: the destination (header and metadata) and the
/// body it returned, or an immediate response's (status, body).
#[derive(Debug, PartialEq)]
enum Outcome {
    Routed { header: String, metadata: String, content_length: Option<String>, body: Vec<u8> },
    Immediate(i32, String),
}

/// The destination a request-path answer names: (header, envoy.lb metadata).
fn destination(common: Option<CommonResponse>, md: Option<Struct>) -> (String, String) {
    let set = common.and_then(|c| c.header_mutation).map(|m| m.set_headers).unwrap_or_default();
    let h = set.iter().filter_map(|o| o.header.as_ref()).find(|h| h.key == "x-gateway-destination-endpoint");
    let header = String::from_utf8(h.expect("the destination header").raw_value.clone()).unwrap();
    let md = md.expect("dynamic metadata");
    let Some(Kind::StructValue(lb)) = &md.fields["envoy.lb"].kind else { panic!("no envoy.lb: {md:?}") };
    let Some(Kind::StringValue(m)) = &lb.fields["x-gateway-destination-endpoint"].kind else { panic!() };
    (header, m.clone())
}

impl Envoy {
    /// BUFFERED, as announced by newer Envoys: the headers are answered before the body is
    /// sent, and the one body message's answer names the destination.
    async fn buffered(&mut self, body: &[u8]) -> (String, String) {
        let mode = ProtocolConfiguration { request_body_mode: 2, ..Default::default() };
        let headers = HttpHeaders { end_of_stream: false, ..Default::default() };
        let first = ProcessingRequest {
            request: Some(Msg::RequestHeaders(headers)),
            protocol_config: Some(mode),
            ..Default::default()
        };
        self.tx.send(first).await.unwrap();
        let ProcessingResponse { response: Some(Reply::RequestHeaders(_)), dynamic_metadata: None, .. } =
            self.rx.message().await.unwrap().unwrap()
        else {
            panic!("the headers are answered first, without a destination")
        };
        self.send(Msg::RequestBody(body_chunk(body, true)), None).await;
        let r = self.rx.message().await.unwrap().unwrap();
        let Some(Reply::RequestBody(b)) = r.response else { panic!("the body answer: {r:?}") };
        destination(b.response, r.dynamic_metadata)
    }

    /// A request without body (headers with end_of_stream): answered at once.
    async fn bodiless(&mut self) -> (String, String) {
        let headers = HttpHeaders { end_of_stream: true, ..Default::default() };
        self.send(Msg::RequestHeaders(headers), None).await;
        let r = self.rx.message().await.unwrap().unwrap();
        let Some(Reply::RequestHeaders(h)) = r.response else { panic!("the headers answer: {r:?}") };
        destination(h.response, r.dynamic_metadata)
    }

    async fn open(ext: &EppExtension) -> Self {
        let mut c = ExternalProcessorClient::connect(format!("http://{}", ext.addr())).await.unwrap();
        let (tx, rx) = mpsc::channel(64);
        let rx = c.process(ReceiverStream::new(rx)).await.unwrap().into_inner();
        Self { tx, rx }
    }

    async fn send(&self, request: Msg, metadata: Option<Metadata>) {
        let m =
            ProcessingRequest { request: Some(request), metadata_context: metadata, ..Default::default() };
        // Fails once the picker ended the stream (an immediate response): read its answer then.
        let _ = self.tx.send(m).await;
    }

    async fn next(&mut self) -> Reply {
        self.rx.message().await.unwrap().expect("a response").response.expect("a response kind")
    }

    /// Request headers (with the subset hint if any), then `body` in chunks of `chunk` bytes.
    async fn request(&mut self, body: &[u8], chunk: usize, hint: Option<&[&str]>) -> Outcome {
        let headers = HeaderMap {
            headers: vec![HeaderValue {
                key: ":method".into(),
                raw_value: b"POST".to_vec(),
                ..Default::default()
            }],
        };
        let http = HttpHeaders { headers: Some(headers), end_of_stream: false, ..Default::default() };
        self.send(Msg::RequestHeaders(http), hint.map(subset)).await;
        let chunks: Vec<&[u8]> = body.chunks(chunk).collect();
        for (i, c) in chunks.iter().enumerate() {
            self.send(Msg::RequestBody(body_chunk(c, i + 1 == chunks.len())), None).await;
        }
        self.outcome().await
    }

    async fn outcome(&mut self) -> Outcome {
        let m = match self.rx.message().await.unwrap().expect("a response") {
            ProcessingResponse { response: Some(Reply::ImmediateResponse(i)), .. } => {
                return Outcome::Immediate(i.status.unwrap().code, String::from_utf8(i.body).unwrap())
            }
            ProcessingResponse { response: Some(Reply::RequestHeaders(h)), dynamic_metadata, .. } => {
                (h, dynamic_metadata)
            }
            other => panic!("expected the request headers answer, got {other:?}"),
        };
        let (h, md) = m;
        let set = h.response.unwrap().header_mutation.unwrap().set_headers;
        let value = |k: &str| {
            let h = set.iter().filter_map(|o| o.header.as_ref()).find(|h| h.key.eq_ignore_ascii_case(k))?;
            Some(String::from_utf8(h.raw_value.clone()).unwrap())
        };
        let header = value("x-gateway-destination-endpoint").expect("the destination header");
        let md = md.expect("dynamic metadata");
        let Some(Kind::StructValue(lb)) = &md.fields["envoy.lb"].kind else { panic!("no envoy.lb: {md:?}") };
        let Some(Kind::StringValue(metadata)) = &lb.fields["x-gateway-destination-endpoint"].kind else {
            panic!()
        };
        let body = self.streamed_body(true).await;
        Outcome::Routed { header, metadata: metadata.clone(), content_length: value("content-length"), body }
    }

    /// Streamed body chunks until one says end_of_stream, each at most 62,000 bytes.
    async fn streamed_body(&mut self, request: bool) -> Vec<u8> {
        let mut body = Vec::new();
        loop {
            let b = match (self.next().await, request) {
                (Reply::RequestBody(b), true) | (Reply::ResponseBody(b), false) => b,
                (other, _) => panic!("expected a body chunk, got {other:?}"),
            };
            let Some(body_mutation::Mutation::StreamedResponse(s)) =
                b.response.unwrap().body_mutation.unwrap().mutation
            else {
                panic!("not streamed")
            };
            assert!(s.body.len() <= 62_000, "chunk of {} bytes", s.body.len());
            body.extend(s.body);
            if s.end_of_stream {
                return body;
            }
        }
    }

    /// The response path: headers, `body` in two chunks; all passed on unchanged.
    async fn respond(&mut self, body: &[u8]) -> Vec<u8> {
        self.send(Msg::ResponseHeaders(HttpHeaders::default()), None).await;
        assert!(matches!(self.next().await, Reply::ResponseHeaders(_)));
        let (a, b) = body.split_at(body.len() / 2);
        self.send(Msg::ResponseBody(body_chunk(a, false)), None).await;
        self.send(Msg::ResponseBody(body_chunk(b, true)), None).await;
        let mut out = Vec::new();
        loop {
            let Reply::ResponseBody(r) = self.next().await else { panic!("a response body chunk") };
            let Some(body_mutation::Mutation::StreamedResponse(s)) =
                r.response.unwrap().body_mutation.unwrap().mutation
            else {
                panic!("not streamed")
            };
            out.extend(s.body);
            if s.end_of_stream {
                return out;
            }
        }
    }
}

/// A body chunk as Envoy sends it in full-duplex or buffered mode.
fn body_chunk(body: &[u8], end_of_stream: bool) -> HttpBody {
    HttpBody { body: body.to_vec(), end_of_stream, ..Default::default() }
}

fn subset(endpoints: &[&str]) -> Metadata {
    let list = endpoints.iter().map(|e| Value { kind: Some(Kind::StringValue(e.to_string())) }).collect();
    let v = Value { kind: Some(Kind::ListValue(ListValue { values: list })) };
    let s = Struct { fields: [("x-gateway-destination-endpoint-subset".to_string(), v)].into() };
    Metadata { filter_metadata: [("envoy.lb.subset_hint".to_string(), s)].into(), ..Default::default() }
}

fn completion(model: &str, prompt: &str, pad: usize) -> Vec<u8> {
    serde_json::json!({"model": model, "prompt": prompt, "max_tokens": 8, "pad": "x".repeat(pad)})
        .to_string()
        .into_bytes()
}

fn routed_to(o: &Outcome) -> &str {
    match o {
        Outcome::Routed { header, metadata, .. } => {
            assert_eq!(header, metadata, "header and envoy.lb metadata name one endpoint");
            header
        }
        Outcome::Immediate(code, body) => panic!("immediate {code}: {body}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_is_routed_to_the_longest_prefix_within_the_subset_and_load() {
    assert_eq!(prefixlog_facades::epp::META_SERVING_URL, prefixlog_bridge::META_SERVING_URL);
    let (_kafka, spec, node, ext) = start("prefixlog.epp", 0, 64).await;
    // P1 = w0..w15 (4 blocks): worker 2 holds all, worker 1 two. P2 = w20..w35: 1 and 2 all.
    let (p1, p2): (Vec<u32>, Vec<u32>) = ((0..16).collect(), (20..36).collect());
    let workers = [(1, "llama"), (2, "llama"), (3, "llama"), (4, "other")];
    let held = [(1, p1[..8].to_vec()), (2, p1.clone()), (1, p2.clone()), (2, p2.clone()), (4, p1.clone())];
    publish(&spec, &node, &workers, &held).await;
    assert_eq!(health(&ext, "liveness").await, health_check_response::ServingStatus::Serving);
    wait_ready(&ext).await;
    assert_eq!(
        health(&ext, "envoy.service.ext_proc.v3.ExternalProcessor").await,
        health_check_response::ServingStatus::Serving
    );

    // The longest prefix, with a body over two streamed chunks given back byte for byte.
    let body = completion("llama", &words(0..16), 130_000);
    let mut a = Envoy::open(&ext).await;
    let o = a.request(&body, 7_777, None).await;
    assert_eq!(routed_to(&o), endpoint(2));
    let Outcome::Routed { body: back, content_length, .. } = &o else { unreachable!() };
    assert!(back == &body, "the body comes back unchanged");
    assert_eq!(content_length.as_deref(), Some(body.len().to_string().as_str()));

    // Depths tie on P2: the request in flight at worker 2 sends the next one to worker 1.
    let mut b = Envoy::open(&ext).await;
    assert_eq!(routed_to(&b.request(&completion("llama", &words(20..36), 0), 50, None).await), endpoint(1));
    // Worker 2's response ends: its load is given back, and worker 1 still has one in flight.
    assert_eq!(a.respond(b"{\"choices\": []}").await, b"{\"choices\": []}");
    let mut c = Envoy::open(&ext).await;
    assert_eq!(routed_to(&c.request(&completion("llama", &words(20..36), 0), 50, None).await), endpoint(2));
    b.respond(b"ok").await;
    c.respond(b"ok").await;

    // The subset hint restricts the pick: without worker 2, worker 1's two blocks win.
    let p1_body = completion("llama", &words(0..16), 0);
    let hinted = |hint: &'static [&'static str]| {
        let (ext, body) = (ext.clone(), p1_body.clone());
        async move { Envoy::open(&ext).await.request(&body, 1 << 20, Some(hint)).await }
    };
    assert_eq!(routed_to(&hinted(&["10.0.0.1:8000", "10.0.0.3:8000"]).await), endpoint(1));
    assert_eq!(routed_to(&hinted(&["10.0.0.3:8000"]).await), endpoint(3));
    // Empty, unknown, or only a worker of another model: nothing eligible, 503.
    for hint in [&[][..], &["10.9.9.9:1"][..], &["10.0.0.4:8000"][..]] {
        let o = hinted(hint).await;
        assert!(matches!(&o, Outcome::Immediate(503, _)), "{hint:?}: {o:?}");
    }

    // Chat: the messages' contents joined with "\n" are P1's words; the whitespace tokenizer
    // makes them P1's tokens.
    let chat = serde_json::json!({"model": "llama", "messages": [
        {"role": "system", "content": words(0..6)},
        {"role": "user", "content": [{"type": "text", "text": words(6..16)}]}
    ]});
    let o = Envoy::open(&ext).await.request(chat.to_string().as_bytes(), 100, None).await;
    assert_eq!(routed_to(&o), endpoint(2));
    let (header, metadata) = Envoy::open(&ext).await.buffered(&p1_body).await;
    assert_eq!((header.as_str(), metadata.as_str()), (endpoint(2).as_str(), endpoint(2).as_str()));
    // No body: routed on load alone, to one of the model's endpoints (any model: no body).
    let (header, metadata) = Envoy::open(&ext).await.bodiless().await;
    assert_eq!(header, metadata);
    assert!(["10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000", "10.0.0.4:8000"].contains(&header.as_str()));

    let o = Envoy::open(&ext).await.request(&completion("gpt", "w1", 0), 64, None).await;
    assert!(matches!(&o, Outcome::Immediate(404, m) if m.contains("gpt")), "{o:?}");
    let o = Envoy::open(&ext).await.request(&completion("llama", "w1", MAX_BODY), 60_000, None).await;
    assert!(matches!(&o, Outcome::Immediate(413, _)), "{o:?}");
    let o = Envoy::open(&ext).await.request(b"{\"prompt\": \"w1\"}", 64, None).await;
    assert!(matches!(&o, Outcome::Immediate(400, _)), "{o:?}");

    let text = prefixlog_query::metrics::render(node.registry());
    assert!(
        text.contains(r#"prefixlog_epp_picks_total{protocol="gie-epp",route="index",shard="all"} 6"#),
        "{text}"
    );
    assert!(text.contains(r#"route="no_prompt",shard="all"} 1"#), "{text}");
    assert!(text.contains(r#"route="balanced",shard="all"} 1"#), "{text}");
    assert!(text.contains(r#"code="UNAVAILABLE",protocol="gie-epp",rpc="Pick",shard="all"} 3"#), "{text}");
    assert!(text.contains(r#"code="NOT_FOUND",protocol="gie-epp",rpc="Pick",shard="all"} 1"#), "{text}");
}

/// A replica that is not ready cannot vouch for its index: the picker fails open to the least
/// loaded endpoint, even away from the worker holding the prefix, and counts it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unavailable_index_fails_open_to_the_least_loaded() {
    let (_kafka, spec, node, ext) = start("prefixlog.epp.open", -1, 2).await;
    let p1: Vec<u32> = (0..16).collect();
    publish(&spec, &node, &[(1, "llama"), (2, "llama")], &[(1, p1)]).await;
    assert_eq!(health(&ext, "liveness").await, health_check_response::ServingStatus::Serving);
    assert_eq!(health(&ext, "readiness").await, health_check_response::ServingStatus::NotServing);

    let body = completion("llama", &words(0..16), 0);
    let mut first = Envoy::open(&ext).await;
    let one = routed_to(&first.request(&body, 1024, None).await).to_string();
    let mut second = Envoy::open(&ext).await;
    let two = routed_to(&second.request(&body, 1024, None).await).to_string();
    let mut both = vec![one.clone(), two];
    both.sort();
    assert_eq!(both, vec![endpoint(1), endpoint(2)], "the second goes to the one without load");

    // Two streams is the bound: a third is refused at once.
    let mut c = ExternalProcessorClient::connect(format!("http://{}", ext.addr())).await.unwrap();
    let (_tx, rx) = mpsc::channel::<ProcessingRequest>(1);
    let refused = c.process(ReceiverStream::new(rx)).await.expect_err("over the bound");
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted, "{refused}");
    // The first stream goes away before its response: its place and its load are given back
    // (the place only after the load), so the next request goes where the first one went.
    drop(first);
    let mut third = None;
    for _ in 0..3000 {
        let mut c = ExternalProcessorClient::connect(format!("http://{}", ext.addr())).await.unwrap();
        let (tx, rx) = mpsc::channel(64);
        if let Ok(r) = c.process(ReceiverStream::new(rx)).await {
            third = Some(Envoy { tx, rx: r.into_inner() });
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut third = third.expect("a place is free once the first stream is gone");
    assert_eq!(routed_to(&third.request(&body, 1024, None).await), one);
    drop(second);
    let picks = ext.picks().unwrap();
    assert_eq!(picks.picks_of(prefixlog_facades::epp::policy::Route::FailOpen), 3);
}

/// A stream that stops sending while its request is read is ended (its buffer freed) with
/// DEADLINE_EXCEEDED; the outcome is asserted, not the time it took.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_request_is_ended() {
    let (_kafka, _spec, _node, ext) =
        start_with("prefixlog.epp.stall", 0, 4, Duration::from_millis(50)).await;
    let mut envoy = Envoy::open(&ext).await;
    envoy.send(Msg::RequestHeaders(HttpHeaders::default()), None).await;
    envoy.send(Msg::RequestBody(body_chunk(b"{\"model\":", false)), None).await;
    let status = envoy.rx.message().await.expect_err("the stream ends with an error");
    assert_eq!(status.code(), tonic::Code::DeadlineExceeded, "{status}");
}

/// The GRPC body send mode (gRPC messages one by one) is not served: announced on the first
/// message, or seen in a body's GRPC-only fields (request or response path), the stream ends
/// with UNIMPLEMENTED, so the data plane applies its failure mode; each is counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_grpc_body_mode_is_refused() {
    let (_kafka, spec, node, ext) = start("prefixlog.epp.grpc", 0, 8).await;
    publish(&spec, &node, &[(1, "llama")], &[]).await;
    wait_ready(&ext).await;
    let refused = |what: &str, r: Result<Option<ProcessingResponse>, tonic::Status>| {
        let status = r.expect_err("the stream ends with an error status");
        assert_eq!(status.code(), tonic::Code::Unimplemented, "{what}: {status}");
        assert!(status.message().contains("GRPC"), "{what}: {status}");
    };
    let (full_duplex, grpc) = (4, 5);
    for (request_body_mode, response_body_mode) in [(grpc, full_duplex), (full_duplex, grpc)] {
        let mut envoy = Envoy::open(&ext).await;
        let mode = ProtocolConfiguration { request_body_mode, response_body_mode, ..Default::default() };
        let first = ProcessingRequest {
            request: Some(Msg::RequestHeaders(HttpHeaders::default())),
            protocol_config: Some(mode),
            ..Default::default()
        };
        envoy.tx.send(first).await.unwrap();
        refused("announced", envoy.rx.message().await);
    }
    let compressed = HttpBody { body: vec![0; 5], grpc_message_compressed: true, ..Default::default() };
    let half_close =
        HttpBody { end_of_stream: true, end_of_stream_without_message: true, ..Default::default() };
    for body in [compressed.clone(), half_close] {
        let mut envoy = Envoy::open(&ext).await;
        envoy.send(Msg::RequestHeaders(HttpHeaders::default()), None).await;
        envoy.send(Msg::RequestBody(body), None).await;
        refused("request body", envoy.rx.message().await);
    }
    // Routed first (full duplex): a framed response body ends the stream as well.
    let mut envoy = Envoy::open(&ext).await;
    assert_eq!(routed_to(&envoy.request(&completion("llama", "w1", 0), 64, None).await), endpoint(1));
    envoy.send(Msg::ResponseHeaders(HttpHeaders::default()), None).await;
    assert!(matches!(envoy.next().await, Reply::ResponseHeaders(_)));
    envoy.send(Msg::ResponseBody(compressed), None).await;
    refused("response body", envoy.rx.message().await);

    let text = prefixlog_query::metrics::render(node.registry());
    let unimplemented = r#"code="UNIMPLEMENTED",protocol="gie-epp",rpc="Process",shard="all"} 5"#;
    assert!(text.contains(unimplemented), "{text}");
}

/// Two replicas of one log behind their pickers route alike, and a record on the log is routed
/// by once the replica has applied it (its consistency token).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_pick_alike_and_a_landed_record_is_routed_by() {
    let (_kafka, spec, a, pick_a) = start("prefixlog.epp.two", 0, 64).await;
    let (b, pick_b) = replica(&spec, "prefixlog.epp.two.b", 0, 64, Duration::from_secs(30)).await;
    let workers = [(1, "llama"), (2, "llama"), (3, "llama")];
    let held = [(1, (0..8).collect()), (2, (0..16).collect()), (3, (20..36).collect::<Vec<u32>>())];
    publish(&spec, &a, &workers, &held).await;
    // Replica b has applied what a has (a's applied offsets are a consistency token).
    assert!(b.status().wait_for(&a.status().offsets(), Duration::from_secs(60)).await);
    wait_ready(&pick_a).await;
    wait_ready(&pick_b).await;
    for (prompt, want) in [(words(0..16), 2), (words(0..8), 2), (words(20..36), 3)] {
        let body = completion("llama", &prompt, 0);
        let mut routes = Vec::new();
        for ext in [&pick_a, &pick_b] {
            let mut envoy = Envoy::open(ext).await;
            let o = envoy.request(&body, 1 << 20, None).await;
            routes.push(routed_to(&o).to_string());
            envoy.respond(b"ok").await;
        }
        assert_eq!(routes, vec![endpoint(want), endpoint(want)], "{prompt}");
    }

    // Worker 3 now holds the longest prefix of w0..w23: once replica b has applied the record,
    // its picker routes there (a second feed record of worker 3, numbered after its first).
    let p = Publisher::new(&spec).unwrap();
    let chain = scheme::block_hashes(&(0..24).collect::<Vec<u32>>(), BLOCK as usize);
    let ops = [KvOp::Stored {
        tier: Tier::Gpu,
        lane: 0,
        parent_ext: None,
        blocks: chain.iter().map(|&l| (l, l)).map(BlockHashes::from).collect(),
    }];
    let ks = KeyspaceId::new("llama", BLOCK, 1);
    let landed = p.publish_kv_events(&ks, 3, 0, 1, 2, false, &ops, None).await.unwrap();
    assert!(b.status().wait_for(&token_of(&[landed]), Duration::from_secs(60)).await);
    let mut envoy = Envoy::open(&pick_b).await;
    let o = envoy.request(&completion("llama", &words(0..24), 0), 1 << 20, None).await;
    assert_eq!(routed_to(&o), endpoint(3));
    b.kill().await;
}
