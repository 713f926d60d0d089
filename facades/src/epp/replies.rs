//! The `ProcessingResponse`s the picker sends, built from the GIE protocol's rules
//! (docs/compat/gie-epp.md): the destination in a header and in `envoy.lb` dynamic metadata
//! with one value, bodies returned in chunks of at most [`MAX_CHUNK_BYTES`], errors as
//! immediate responses.

use super::pb::envoy::config::core::v3::{
    header_value_option::HeaderAppendAction, HeaderValue, HeaderValueOption,
};
use super::pb::envoy::r#type::v3::HttpStatus;
use super::pb::processing_response::Response;
use super::pb::*;
use super::{DESTINATION_KEY, LB_NAMESPACE, MAX_CHUNK_BYTES};
use prost_types::{value::Kind, Struct, Value};
use std::net::SocketAddr;

/// A header set (replacing one the client may have sent: the destination is the picker's).
fn set(key: &str, value: &str) -> HeaderValueOption {
    HeaderValueOption {
        header: Some(HeaderValue {
            key: key.into(),
            raw_value: value.as_bytes().to_vec(),
            ..Default::default()
        }),
        append_action: HeaderAppendAction::OverwriteIfExistsOrAdd as i32,
        ..Default::default()
    }
}

/// `{"envoy.lb": {"x-gateway-destination-endpoint": "ip:port"}}`.
pub fn destination_metadata(e: SocketAddr) -> Struct {
    let inner = Struct {
        fields: [(DESTINATION_KEY.to_string(), Value { kind: Some(Kind::StringValue(e.to_string())) })]
            .into(),
    };
    Struct { fields: [(LB_NAMESPACE.to_string(), Value { kind: Some(Kind::StructValue(inner)) })].into() }
}

/// The common response routing to `e`; `content_length` for a body about to be re-sent.
fn routed(e: SocketAddr, content_length: Option<usize>) -> CommonResponse {
    let mut set_headers = vec![set(DESTINATION_KEY, &e.to_string())];
    if let Some(n) = content_length {
        set_headers.push(set("content-length", &n.to_string()));
    }
    CommonResponse {
        header_mutation: Some(HeaderMutation { set_headers, ..Default::default() }),
        // The route may depend on the header just set.
        clear_route_cache: true,
        ..Default::default()
    }
}

/// Full duplex: the answer to `request_headers`, naming the destination.
pub fn headers_routed(e: SocketAddr, content_length: Option<usize>) -> ProcessingResponse {
    ProcessingResponse {
        response: Some(Response::RequestHeaders(HeadersResponse {
            response: Some(routed(e, content_length)),
        })),
        dynamic_metadata: Some(destination_metadata(e)),
        ..Default::default()
    }
}

/// Buffered: the answer to the one `request_body`, naming the destination (body unchanged).
pub fn body_routed(e: SocketAddr) -> ProcessingResponse {
    ProcessingResponse {
        response: Some(Response::RequestBody(BodyResponse { response: Some(routed(e, None)) })),
        dynamic_metadata: Some(destination_metadata(e)),
        ..Default::default()
    }
}

/// Buffered: the answer to `request_headers` before the body is seen (nothing changed yet).
pub fn headers_continue() -> ProcessingResponse {
    let common = CommonResponse { clear_route_cache: true, ..Default::default() };
    ProcessingResponse {
        response: Some(Response::RequestHeaders(HeadersResponse { response: Some(common) })),
        ..Default::default()
    }
}

/// `body` returned as streamed chunks of at most [`MAX_CHUNK_BYTES`], the last one saying
/// `end_of_stream` when `end`; `request` picks the direction. An empty body is one empty chunk.
pub fn streamed(body: &[u8], end: bool, request: bool) -> Vec<ProcessingResponse> {
    let chunks: Vec<&[u8]> =
        if body.is_empty() { vec![&[][..]] } else { body.chunks(MAX_CHUNK_BYTES).collect() };
    let last = chunks.len() - 1;
    chunks
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            // The GRPC body mode's fields stay unset: the picker does not serve that mode.
            let mutation = body_mutation::Mutation::StreamedResponse(StreamedBodyResponse {
                body: c.to_vec(),
                end_of_stream: end && i == last,
                ..Default::default()
            });
            let common = CommonResponse {
                body_mutation: Some(BodyMutation { mutation: Some(mutation) }),
                ..Default::default()
            };
            let r = BodyResponse { response: Some(common) };
            let response = if request { Response::RequestBody(r) } else { Response::ResponseBody(r) };
            ProcessingResponse { response: Some(response), ..Default::default() }
        })
        .collect()
}

/// Passes the response's headers on unchanged.
pub fn response_headers() -> ProcessingResponse {
    ProcessingResponse {
        response: Some(Response::ResponseHeaders(HeadersResponse::default())),
        ..Default::default()
    }
}

/// Passes a (buffered) response body on unchanged.
pub fn response_body_unchanged() -> ProcessingResponse {
    ProcessingResponse {
        response: Some(Response::ResponseBody(BodyResponse::default())),
        ..Default::default()
    }
}

/// Passes trailers on unchanged (`request`: the request's, else the response's).
pub fn trailers(request: bool) -> ProcessingResponse {
    let t = TrailersResponse::default();
    let response = if request { Response::RequestTrailers(t) } else { Response::ResponseTrailers(t) };
    ProcessingResponse { response: Some(response), ..Default::default() }
}

/// An immediate response ending the request: `status` with `reason` as a plain-text body.
pub fn immediate(status: u16, reason: &str) -> ProcessingResponse {
    let r = ImmediateResponse {
        status: Some(HttpStatus { code: i32::from(status) }),
        headers: Some(HeaderMutation {
            set_headers: vec![set("content-type", "text/plain")],
            ..Default::default()
        }),
        body: reason.as_bytes().to_vec(),
        details: format!("prefixlog_epp_{status}"),
        ..Default::default()
    };
    ProcessingResponse { response: Some(Response::ImmediateResponse(r)), ..Default::default() }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(r: &ProcessingResponse) -> (usize, bool) {
        let Some(Response::RequestBody(BodyResponse { response: Some(c) })) = &r.response else {
            panic!("{r:?}")
        };
        match &c.body_mutation.as_ref().unwrap().mutation {
            Some(body_mutation::Mutation::StreamedResponse(s)) => (s.body.len(), s.end_of_stream),
            m => panic!("{m:?}"),
        }
    }

    #[test]
    fn bodies_are_cut_at_the_chunk_bound() {
        let body = vec![7u8; 2 * MAX_CHUNK_BYTES + 5];
        let r: Vec<(usize, bool)> = streamed(&body, true, true).iter().map(chunk).collect();
        assert_eq!(r, vec![(MAX_CHUNK_BYTES, false), (MAX_CHUNK_BYTES, false), (5, true)]);
        assert_eq!(streamed(&[], true, true).iter().map(chunk).collect::<Vec<_>>(), vec![(0, true)]);
        assert_eq!(streamed(&[1], false, true).iter().map(chunk).collect::<Vec<_>>(), vec![(1, false)]);
    }

    /// The top-level field numbers of `r` as encoded, in wire order.
    fn wire_fields(r: &ProcessingResponse) -> Vec<u32> {
        use prost::encoding::{decode_key, skip_field, DecodeContext};
        let bytes = prost::Message::encode_to_vec(r);
        let mut buf = bytes.as_slice();
        let mut fields = Vec::new();
        while !buf.is_empty() {
            let (tag, wire_type) = decode_key(&mut buf).unwrap();
            skip_field(wire_type, tag, &mut buf, DecodeContext::default()).unwrap();
            fields.push(tag);
        }
        fields
    }

    /// ProcessingResponse field 11 is `request_drain` (a bool) in the pinned Envoy API and
    /// `streamed_immediate_response` (a message) in later Envoy; 12 and 13 are later still. No
    /// reply carries any of them, so every Envoy version decodes the picker's replies alike; nor
    /// the GRPC body mode's chunk fields.
    #[test]
    fn replies_stay_within_fields_every_envoy_version_reads_alike() {
        let e: SocketAddr = "10.0.0.1:8000".parse().unwrap();
        let mut all = vec![
            headers_routed(e, Some(3)),
            body_routed(e),
            headers_continue(),
            response_headers(),
            response_body_unchanged(),
            trailers(true),
            trailers(false),
            immediate(503, "no eligible endpoint"),
        ];
        all.extend(streamed(&[7; 10], true, true));
        all.extend(streamed(&[], true, false));
        for r in &all {
            let fields = wire_fields(r);
            assert!(!fields.is_empty() && fields.iter().all(|f| (1..=10).contains(f)), "{fields:?}: {r:?}");
        }
        for r in &all[all.len() - 2..] {
            let (Some(Response::RequestBody(b)) | Some(Response::ResponseBody(b))) = &r.response else {
                panic!("{r:?}")
            };
            let m = b.response.as_ref().unwrap().body_mutation.as_ref().unwrap();
            let Some(body_mutation::Mutation::StreamedResponse(s)) = &m.mutation else { panic!("{m:?}") };
            assert!(!s.end_of_stream_without_message && !s.grpc_message_compressed, "{s:?}");
        }
    }

    #[test]
    fn header_and_metadata_name_one_endpoint() {
        let e: SocketAddr = "10.0.0.1:8000".parse().unwrap();
        let r = headers_routed(e, Some(3));
        let md = r.dynamic_metadata.unwrap();
        let Some(Kind::StructValue(lb)) = &md.fields[LB_NAMESPACE].kind else { panic!() };
        assert_eq!(lb.fields[DESTINATION_KEY].kind, Some(Kind::StringValue("10.0.0.1:8000".into())));
        let Some(Response::RequestHeaders(h)) = r.response else { panic!() };
        let set = h.response.unwrap().header_mutation.unwrap().set_headers;
        let h0 = set[0].header.as_ref().unwrap();
        assert_eq!((h0.key.as_str(), h0.raw_value.as_slice()), (DESTINATION_KEY, &b"10.0.0.1:8000"[..]));
        assert_eq!(set[1].header.as_ref().unwrap().raw_value, b"3");
    }
}
