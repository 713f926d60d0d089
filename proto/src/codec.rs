//! The gRPC codec of every prefixlog service: protobuf with prost, the same bytes on the wire as
//! `tonic_prost::ProstCodec` (`application/grpc+proto`), with cheaper buffer handling.
//!
//! Why not `ProstCodec` itself: it decodes through tonic's `DecodeBuf` and encodes through its
//! `EncodeBuf`, so every varint and fixed64 goes through a `Buf`/`BufMut` call on a `BytesMut`
//! (bounds checks and bookkeeping per field). A `Match` answer listing every worker (256 scores
//! in `bench-query`) spent more time there than in the engine's match: the client's decode and
//! the server's encode were most of the gap between `Match` and an `Echo` of the same size.
//! Here a message is decoded from one contiguous slice (tonic hands a decoder a whole message,
//! and its buffer is one `BytesMut`) and encoded into a `Vec` of its exact size, then copied
//! into tonic's buffer with one `put_slice`.
//!
//! `MatchResponse`, the one message on the hot path that carries hundreds of small nested
//! messages, is encoded and decoded by [`crate::match_wire`] (same bytes again; prost handles
//! everything but its score list).

use crate::match_wire;
use crate::v1::MatchResponse;
use prost::bytes::{Buf, BufMut};
use prost::Message;
use std::any::Any;
use std::marker::PhantomData;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::Status;

/// Encodes `T`, decodes `U` (prost messages). Named by `codec_path` in `build.rs`.
#[derive(Debug, Clone, Copy)]
pub struct SliceCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for SliceCodec<T, U> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

impl<T, U> Codec for SliceCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = SliceEncoder<T>;
    type Decoder = SliceDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        SliceEncoder(PhantomData)
    }

    fn decoder(&mut self) -> Self::Decoder {
        SliceDecoder(PhantomData)
    }
}

/// Encodes a message into a `Vec` of its exact size, then into tonic's buffer.
#[derive(Debug, Clone, Copy)]
pub struct SliceEncoder<T>(PhantomData<T>);

impl<T: Message + 'static> Encoder for SliceEncoder<T> {
    type Item = T;
    type Error = Status;

    fn encode(&mut self, mut item: T, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        let bytes = match (&mut item as &mut dyn Any).downcast_mut::<MatchResponse>() {
            Some(r) => match_wire::encode(std::mem::take(r)),
            None => item.encode_to_vec(),
        };
        buf.reserve(bytes.len());
        buf.put_slice(&bytes);
        Ok(())
    }
}

/// Decodes a message from its bytes as one slice.
#[derive(Debug, Clone, Copy)]
pub struct SliceDecoder<U>(PhantomData<U>);

impl<U: Message + Default + 'static> Decoder for SliceDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        let len = buf.remaining();
        let item = if buf.chunk().len() == len {
            let mut item = U::default();
            match (&mut item as &mut dyn Any).downcast_mut::<MatchResponse>() {
                Some(r) => *r = match_wire::decode(buf.chunk()).map_err(decode_error)?,
                None => item = U::decode(buf.chunk()).map_err(decode_error)?,
            }
            buf.advance(len);
            item
        } else {
            // Not one slice (not what tonic 0.14 hands over): decode through the buffer.
            U::decode(buf).map_err(decode_error)?
        };
        Ok(Some(item))
    }
}

/// INTERNAL, as the gRPC status-code guide (and `ProstCodec`) map a message that does not parse.
fn decode_error(e: prost::DecodeError) -> Status {
    Status::internal(e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v1::{MatchResponse, PartitionOffset, WorkerScore};
    use tonic::codec::{EncodeBody, SingleMessageCompressionOverride, Streaming};
    use tonic_prost::ProstCodec;

    fn answers() -> Vec<MatchResponse> {
        (0..3u64)
            .map(|n| MatchResponse {
                scores: (0..300 * n)
                    .map(|w| WorkerScore {
                        worker: w * 7919,
                        depth: (300 * n - w) as u32,
                        total_blocks: 1 << 20,
                        gapped: w % 3 == 0,
                        ..Default::default()
                    })
                    .collect(),
                applied: vec![PartitionOffset { partition: 3, offset: 1 << 40 }],
                replica_id: format!("replica-{n}"),
                request_id: u64::MAX - n,
                ..Default::default()
            })
            .collect()
    }

    /// Messages encoded by `C1`'s encoder, framed by tonic, decoded by `C2`'s decoder.
    async fn through<C1, C2>(mut enc: C1, mut dec: C2, msgs: Vec<MatchResponse>) -> Vec<MatchResponse>
    where
        C1: Codec<Encode = MatchResponse>,
        C2: Codec<Decode = MatchResponse>,
    {
        let source = tokio_stream::iter(msgs.into_iter().map(Ok::<_, Status>));
        let body = EncodeBody::new_server(
            enc.encoder(),
            source,
            None,
            SingleMessageCompressionOverride::default(),
            None,
        );
        let mut stream = Streaming::new_request(dec.decoder(), body, None, None);
        let mut out = Vec::new();
        while let Some(m) = stream.message().await.expect("decodes") {
            out.push(m);
        }
        out
    }

    #[tokio::test]
    async fn speaks_the_same_wire_format_as_prost_codec() {
        let slice = SliceCodec::<MatchResponse, MatchResponse>::default;
        let prost = ProstCodec::<MatchResponse, MatchResponse>::default;
        assert_eq!(through(slice(), slice(), answers()).await, answers());
        assert_eq!(through(slice(), prost(), answers()).await, answers());
        assert_eq!(through(prost(), slice(), answers()).await, answers());
    }

    /// Writes its bytes as the message, verbatim (tonic frames them).
    struct RawEncoder;

    impl Encoder for RawEncoder {
        type Item = Vec<u8>;
        type Error = Status;

        fn encode(&mut self, item: Vec<u8>, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
            buf.put_slice(&item);
            Ok(())
        }
    }

    #[tokio::test]
    async fn a_message_that_does_not_parse_is_internal() {
        // A WorkerScore whose length prefix runs past the end of the message.
        let source = tokio_stream::iter([Ok::<_, Status>(vec![0x0a, 0x7f, 0x08, 0x01])]);
        let body = EncodeBody::new_server(
            RawEncoder,
            source,
            None,
            SingleMessageCompressionOverride::default(),
            None,
        );
        let decoder = SliceCodec::<MatchResponse, MatchResponse>::default().decoder();
        let mut stream = Streaming::new_request(decoder, body, None, None);
        let err = stream.message().await.expect_err("a truncated message");
        assert_eq!(err.code(), tonic::Code::Internal, "{err:?}");
    }
}
