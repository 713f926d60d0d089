//! One `Process` stream (one HTTP request): what the picker answers to each message Envoy
//! sends, in the order the GIE protocol sets (docs/compat/gie-epp.md, "What Envoy sends").
//!
//! Full duplex (the GIE configuration): the request headers are recorded and not answered; the
//! body is buffered to its end (bounded: 413 past `max_body_bytes`); then the headers answer
//! names the destination and the body goes back unchanged in streamed chunks. Buffered: the
//! headers are answered at once, the one body message with the destination. On the response
//! path everything is passed on unchanged; the request's place in its endpoint's load is given
//! back when the response ends (or, dropping the [`Exchange`], when the stream does).
//!
//! The GRPC body send mode (gRPC messages one by one, announced in `protocol_config`, or seen
//! in a body's `end_of_stream_without_message` / `grpc_message_compressed`) is not served: the
//! picker reads OpenAI JSON, and its chunked echo would split messages. Such a stream ends with
//! UNIMPLEMENTED ([`StreamError`]), and the data plane applies its failure mode.

use super::endpoints::subset_hint;
use super::pb::envoy::extensions::filters::http::ext_proc::v3::processing_mode::BodySendMode;
use super::pb::processing_request::Request as Msg;
use super::pb::{HttpBody, HttpHeaders, ProcessingRequest, ProcessingResponse};
use super::picker::{PickError, Picker};
use super::policy::Lease;
use super::prompt::{self, Ask};
use super::replies;
use super::BodyMode;
use crate::metrics::FacadeMetrics;
use std::net::SocketAddr;
use tonic::Status;

/// What to do after one message.
#[derive(Debug)]
pub enum Step {
    /// Send these (possibly none) and read on.
    Reply(Vec<ProcessingResponse>),
    /// Send this immediate response and end the stream.
    Done(ProcessingResponse),
    /// End the stream with this status (the data plane applies its failure mode).
    Close(Status),
}

/// Why a stream is not served at all.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    #[error(
        "the {0} body send mode GRPC is not supported by this endpoint picker \
         (configure FULL_DUPLEX_STREAMED or BUFFERED)"
    )]
    GrpcBodyMode(&'static str),
    #[error(
        "a {0} body message carries gRPC message framing (end_of_stream_without_message or \
         grpc_message_compressed), used only by the GRPC body send mode, which this endpoint \
         picker does not support"
    )]
    GrpcFraming(&'static str),
}

impl StreamError {
    pub fn status(&self) -> Status {
        Status::unimplemented(self.to_string())
    }
}

/// The GRPC body mode's framing on a body message, which the picker cannot pass on as chunks.
fn grpc_framing(m: &Option<Msg>) -> Result<(), StreamError> {
    let framed = |b: &HttpBody| b.end_of_stream_without_message || b.grpc_message_compressed;
    match m {
        Some(Msg::RequestBody(b)) if framed(b) => Err(StreamError::GrpcFraming("request")),
        Some(Msg::ResponseBody(b)) if framed(b) => Err(StreamError::GrpcFraming("response")),
        _ => Ok(()),
    }
}

/// Where the request is.
#[derive(Debug, PartialEq, Eq)]
enum Phase {
    /// Headers and body being read.
    Request,
    /// A destination was answered; the rest is passed on.
    Routed,
}

pub struct Exchange {
    picker: Picker,
    metrics: FacadeMetrics,
    mode: BodyMode,
    /// Whether response bodies arrive as full-duplex chunks to be returned.
    response_streamed: bool,
    first: bool,
    phase: Phase,
    body: Vec<u8>,
    /// The body's bytes taken from the picker's shared budget, given back with the exchange.
    body_bytes: Option<tokio::sync::OwnedSemaphorePermit>,
    hint: Option<Vec<SocketAddr>>,
    lease: Option<Lease>,
}

impl Exchange {
    pub fn new(picker: Picker, metrics: FacadeMetrics, mode: BodyMode) -> Self {
        Self {
            picker,
            metrics,
            mode,
            response_streamed: mode == BodyMode::FullDuplex,
            first: true,
            phase: Phase::Request,
            body: Vec::new(),
            body_bytes: None,
            hint: None,
            lease: None,
        }
    }

    /// Whether the request is still being read (the picker holds its body): the stream's idle
    /// bound applies then.
    pub fn reading_request(&self) -> bool {
        self.phase == Phase::Request
    }

    /// The endpoint the request was routed to, once it was.
    pub fn routed_to(&self) -> Option<SocketAddr> {
        self.lease.as_ref().map(Lease::endpoint)
    }

    pub async fn on(&mut self, m: ProcessingRequest) -> Step {
        let configured = if std::mem::take(&mut self.first) { self.configure(&m) } else { Ok(()) };
        if let Err(e) = configured.and_then(|()| grpc_framing(&m.request)) {
            return self.close(e);
        }
        if let Some(h) = subset_hint(m.metadata_context.as_ref()) {
            self.hint = Some(h);
        }
        match m.request {
            Some(Msg::RequestHeaders(h)) => self.request_headers(h).await,
            Some(Msg::RequestBody(b)) => self.request_body(b).await,
            Some(Msg::RequestTrailers(_)) => self.request_trailers().await,
            Some(Msg::ResponseHeaders(h)) => {
                self.release_if(h.end_of_stream);
                Step::Reply(vec![replies::response_headers()])
            }
            Some(Msg::ResponseBody(b)) => self.response_body(b),
            Some(Msg::ResponseTrailers(_)) => {
                self.release_if(true);
                Step::Reply(vec![replies::trailers(false)])
            }
            None => Step::Reply(Vec::new()),
        }
    }

    /// The body modes Envoy announces on the first message (newer Envoys), over the default.
    fn configure(&mut self, m: &ProcessingRequest) -> Result<(), StreamError> {
        let Some(pc) = &m.protocol_config else { return Ok(()) };
        let grpc = BodySendMode::Grpc as i32;
        if pc.request_body_mode == grpc {
            return Err(StreamError::GrpcBodyMode("request"));
        }
        if pc.response_body_mode == grpc {
            return Err(StreamError::GrpcBodyMode("response"));
        }
        match BodySendMode::try_from(pc.request_body_mode) {
            Ok(BodySendMode::FullDuplexStreamed) => self.mode = BodyMode::FullDuplex,
            Ok(BodySendMode::Buffered | BodySendMode::BufferedPartial) => self.mode = BodyMode::Buffered,
            _ => {}
        }
        self.response_streamed = pc.response_body_mode == BodySendMode::FullDuplexStreamed as i32;
        Ok(())
    }

    async fn request_headers(&mut self, h: HttpHeaders) -> Step {
        if h.end_of_stream {
            // No body (a GET): routed on load alone, answered now.
            return match self.route(None).await {
                Ok(e) => Step::Reply(vec![replies::headers_routed(e, None)]),
                Err(e) => self.refuse(e),
            };
        }
        match self.mode {
            // Envoy waits for this answer before it sends the body.
            BodyMode::Buffered => Step::Reply(vec![replies::headers_continue()]),
            BodyMode::FullDuplex => Step::Reply(Vec::new()),
        }
    }

    async fn request_body(&mut self, b: HttpBody) -> Step {
        if self.phase == Phase::Routed {
            // Nothing should follow the end of the body; pass it on rather than lose it.
            return Step::Reply(replies::streamed(&b.body, b.end_of_stream, true));
        }
        let max = self.picker.limits.max_body_bytes;
        if self.body.len() + b.body.len() > max {
            return self.refuse(PickError::TooLarge(max));
        }
        if let Err(e) = self.take_body_bytes(b.body.len()) {
            return self.refuse(e);
        }
        self.body.extend_from_slice(&b.body);
        // Buffered (also partial) mode sends the body in one message and waits for its answer.
        if b.end_of_stream || self.mode == BodyMode::Buffered {
            return self.body_complete(false).await;
        }
        Step::Reply(Vec::new())
    }

    async fn request_trailers(&mut self) -> Step {
        if self.phase == Phase::Routed {
            return Step::Reply(vec![replies::trailers(true)]);
        }
        // Trailers end a body that did not say end_of_stream.
        match self.body_complete(true).await {
            Step::Reply(mut r) => {
                r.push(replies::trailers(true));
                Step::Reply(r)
            }
            done => done,
        }
    }

    /// The whole body is here: parse, pick, answer the destination and return the body.
    async fn body_complete(&mut self, trailers_follow: bool) -> Step {
        let ask = match self.ask() {
            Ok(a) => a,
            Err(e) => return self.refuse(e.into()),
        };
        let e = match self.route(ask).await {
            Ok(e) => e,
            Err(e) => return self.refuse(e),
        };
        let body = std::mem::take(&mut self.body);
        match self.mode {
            BodyMode::Buffered => Step::Reply(vec![replies::body_routed(e)]),
            BodyMode::FullDuplex => {
                let len = (!body.is_empty()).then_some(body.len());
                let mut out = vec![replies::headers_routed(e, len)];
                out.extend(replies::streamed(&body, !trailers_follow, true));
                Step::Reply(out)
            }
        }
    }

    /// The body's model and prompt; an empty body is routed on load alone.
    fn ask(&self) -> Result<Option<Ask>, prompt::BodyError> {
        if self.body.is_empty() {
            return Ok(None);
        }
        prompt::parse(&self.body).map(Some)
    }

    async fn route(&mut self, ask: Option<Ask>) -> Result<SocketAddr, PickError> {
        let (lease, _route) = self.picker.pick(ask, self.hint.as_deref()).await?;
        let e = lease.endpoint();
        self.lease = Some(lease);
        self.phase = Phase::Routed;
        self.metrics.request("Pick", tonic::Code::Ok);
        Ok(e)
    }

    /// A stream the picker does not serve: counted, ended with the error's status.
    fn close(&mut self, e: StreamError) -> Step {
        self.metrics.request("Process", tonic::Code::Unimplemented);
        tracing::debug!(error = %e, routed = ?self.routed_to(), "endpoint picker: stream not served");
        Step::Close(e.status())
    }

    /// `n` more bytes of the shared body budget, held until the exchange ends.
    fn take_body_bytes(&mut self, n: usize) -> Result<(), PickError> {
        let busy = || PickError::Busy(super::MAX_BUFFERED_BODY_BYTES);
        let n = u32::try_from(n).map_err(|_| busy())?;
        let permit = self.picker.body_bytes.clone().try_acquire_many_owned(n).map_err(|_| busy())?;
        match &mut self.body_bytes {
            Some(held) => held.merge(permit),
            None => self.body_bytes = Some(permit),
        }
        Ok(())
    }

    fn refuse(&mut self, e: PickError) -> Step {
        self.metrics.request("Pick", e.code());
        tracing::debug!(error = %e, status = e.http_status(), "endpoint picker: request refused");
        Step::Done(replies::immediate(e.http_status(), &e.to_string()))
    }

    fn response_body(&mut self, b: HttpBody) -> Step {
        self.release_if(b.end_of_stream);
        if self.response_streamed {
            Step::Reply(replies::streamed(&b.body, b.end_of_stream, false))
        } else {
            Step::Reply(vec![replies::response_body_unchanged()])
        }
    }

    /// The response ended: the endpoint has one request less in flight.
    fn release_if(&mut self, end: bool) {
        if end {
            self.lease = None;
        }
    }
}
