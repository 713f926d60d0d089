//! Drop-in protocol facades (issue 37): other projects' remote-index protocols served by a
//! replica, so an existing gateway or publisher can use prefixlog without changing its code.
//!
//! Every facade is a thin adapter: its writes become records appended to the log through the
//! replica's [`prefixlog_state::LogAppend`] (the binary gives its Kafka publisher; this crate
//! links no Kafka), its answers come from the replica's state through
//! [`prefixlog_query::QueryService::answer_typed`] (the path of
//! `prefixlog.v1` Match: same validation, limits, engine read). A facade is hosted on the query
//! port as a [`prefixlog_query::Extension`], so it shares the replica's readiness
//! (`grpc.health.v1` reports its service name too) and metrics registry. What each upstream
//! message becomes is written down in docs/compat/.
//!
//! Module map:
//! - [`sglang`]: SGLang's `kv_indexer.v1.KVIndexer` (what `sgl-router --kv-indexer-endpoint`
//!   queries and the sgl `kv-indexer-bridge` writes to); docs/compat/sglang.md.
//! - [`smg`]: SMG's `radix_index.RadixIndex` (what SMG's gateway `--kv-indexer-url` and its
//!   `radix-index-bridge` speak); docs/compat/smg.md.
//! - [`http`]: Dynamo's standalone KV indexer HTTP API (`/query`, `/query_by_hash`,
//!   `/workers`, `/register`, `/dump`, ...: the replica subscribes to registered engines
//!   itself), or the query side of Mooncake conductor's (`--http-dialect mooncake`), on a port
//!   of its own; docs/compat/dynamo-mooncake-http.md.
//! - [`start`]: [`start::StartError`], why a facade did not start, and the check every facade
//!   makes first (the replica owns every partition).
//! - [`writes`]: what the writing facades share: catching up with a worker's partition before
//!   continuing its feed, its recorded metadata and name collisions, the metadata size bound,
//!   and [`writes::WriteRefused`], the refusals the SGLang and SMG writers share (their status
//!   and metrics reason).
//! - [`writers`]: writer identity (bearer tokens → the names a client may write), the epoch
//!   step bound and the name check of every write surface.
//! - [`epp`]: a Gateway API Inference Extension endpoint picker (Envoy `ext_proc`) on ports of
//!   its own; docs/compat/gie-epp.md.
//! - [`names`]: upstream worker names (strings) → prefixlog worker ids, per protocol seed.
//! - [`metrics`]: [`metrics::FacadeMetrics`], every facade's counters labelled `protocol`.
//! - [`FILE_DESCRIPTOR_SET`]: the upstream schemas, encoded, for gRPC server reflection.
//!
//! Cargo features `sglang`, `smg`, `http` and `epp` (all on by default) each bring one
//! protocol; only `epp` brings `tokenizers`.

#[cfg(feature = "epp")]
pub mod epp;
#[cfg(feature = "http")]
pub mod http;
pub mod metrics;
pub mod names;
#[cfg(feature = "sglang")]
pub mod sglang;
#[cfg(feature = "smg")]
pub mod smg;
pub mod start;
pub mod writers;
pub mod writes;

/// The encoded `FileDescriptorSet` of the upstream schemas this crate serves (reflection).
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/compat_descriptor.bin"));

/// The storage tiers the answers of SMG and the endpoint picker count: the GPU only. These
/// protocols have no tiers (docs/compat), so a block offloaded to host memory or disk is never
/// reported to their gateways as a GPU hit. (The HTTP dialects map the tiers onto their own
/// fields: `http::dynamo`, `http::reader`.)
#[cfg(any(feature = "smg", feature = "epp"))]
pub(crate) const GPU_ONLY: [prefixlog_engine::Tier; 1] = [prefixlog_engine::Tier::Gpu];

/// `MatchRequest.tiers` counting `tiers`, in preference order.
pub(crate) fn tier_codes(tiers: impl IntoIterator<Item = prefixlog_engine::Tier>) -> Vec<i32> {
    tiers.into_iter().map(|t| t.code() as i32).collect()
}
