//! A Gateway API Inference Extension (GIE) endpoint picker: Envoy's external processor
//! `envoy.service.ext_proc.v3.ExternalProcessor` on a port of its own (default 9002), with
//! `grpc.health.v1` on another (default 9003), as GIE's protocol v1.0.0 defines an endpoint
//! picker (docs/compat/gie-epp.md).
//!
//! Per HTTP request Envoy opens one `Process` stream; the picker buffers the request body,
//! reads the OpenAI `model` and prompt, tokenizes it with the model's `tokenizer.json`, asks the
//! replica which endpoint holds the longest prefix (through `QueryService::answer`, the path of
//! `prefixlog.v1` Match) and answers the destination header and `envoy.lb` metadata.
//!
//! - [`prompt`]: the OpenAI body → model and prompt text or token ids (pure).
//! - [`tokenize`]: the configured models' tokenizers.
//! - [`endpoints`]: workers' serving URLs → `ip:port` endpoints, and the subset hint.
//! - [`policy`]: requests in flight per endpoint and the pick (depth minus load; pure).
//! - [`picker`]: one request's decision: candidates, index query, fail-open.
//! - [`exchange`]: one stream's message exchange (what to answer to each Envoy message).
//! - [`replies`]: the `ProcessingResponse`s: destination header and metadata, chunks, errors.
//! - [`server`]: the gRPC service, the health port and [`EppExtension`].

pub mod endpoints;
pub mod exchange;
pub mod picker;
pub mod policy;
pub mod prompt;
pub mod replies;
pub mod server;
pub mod tokenize;

pub use server::{EppConfig, EppExtension};

/// The schema, generated from `proto/proto/compat/envoy/` (client and server).
pub mod pb {
    #![allow(clippy::all)]
    pub mod envoy {
        pub mod config {
            pub mod core {
                pub mod v3 {
                    tonic::include_proto!("envoy.config.core.v3");
                }
            }
        }
        pub mod r#type {
            pub mod v3 {
                tonic::include_proto!("envoy.r#type.v3");
            }
        }
        pub mod extensions {
            pub mod filters {
                pub mod http {
                    pub mod ext_proc {
                        pub mod v3 {
                            tonic::include_proto!("envoy.extensions.filters.http.ext_proc.v3");
                        }
                    }
                }
            }
        }
        pub mod service {
            pub mod ext_proc {
                pub mod v3 {
                    tonic::include_proto!("envoy.service.ext_proc.v3");
                }
            }
        }
    }
    pub use envoy::service::ext_proc::v3::*;
}

use std::time::Duration;

/// The `protocol` label of this facade's metrics.
pub const PROTOCOL: &str = "gie-epp";
/// The gRPC service name (health reports it with the replica's readiness).
pub const SERVICE_NAME: &str = "envoy.service.ext_proc.v3.ExternalProcessor";
/// GIE's default ext_proc port.
pub const DEFAULT_PORT: u16 = 9002;
/// GIE's default health port.
pub const DEFAULT_HEALTH_PORT: u16 = 9003;
/// The request header and `envoy.lb` metadata key naming the destination (GIE protocol).
pub const DESTINATION_KEY: &str = "x-gateway-destination-endpoint";
/// The dynamic-metadata namespace Envoy's load balancing reads the destination from.
pub const LB_NAMESPACE: &str = "envoy.lb";
/// The metadata namespace and key of the endpoint-subset hint (GIE protocol).
pub const SUBSET_NAMESPACE: &str = "envoy.lb.subset_hint";
pub const SUBSET_KEY: &str = "x-gateway-destination-endpoint-subset";
/// Largest chunk of a streamed body mutation: under the 64 KiB some Envoy builds cap one at.
pub const MAX_CHUNK_BYTES: usize = 62_000;
/// Worker metadata key of a worker's serving URL (what `prefixlog bridge --serving-url`
/// records: the bridge's `META_SERVING_URL`, the same key, pinned by the tests).
pub const META_SERVING_URL: &str = "serving_url";
/// Worker metadata key of the model a worker serves (written by `prefixlog bridge`).
pub const META_MODEL: &str = "model";

/// Bounds of the picker; each a flag of `prefixlog serve`.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Largest request body buffered; a larger one is answered 413.
    pub max_body_bytes: usize,
    /// `Process` streams at once (one per HTTP request in flight); one more is refused with
    /// RESOURCE_EXHAUSTED (Envoy then applies the pool's failure mode).
    pub max_streams: usize,
    /// How long the picker waits for Envoy's next message while it holds a request's body; a
    /// stalled stream is ended so that its buffer is freed.
    pub message_timeout: Duration,
    /// How long one index query may take; a slower one fails open.
    pub index_timeout: Duration,
}

pub const DEFAULT_MAX_BODY_BYTES: usize = 4 << 20;
/// Request bodies' bytes the picker holds at once, across its streams; a body that would pass
/// it is answered 503 (counted RESOURCE_EXHAUSTED) instead of buffered. Without it the bound
/// was `max_streams × max_body_bytes` (4 GiB by default).
pub const MAX_BUFFERED_BODY_BYTES: usize = 256 << 20;
pub const DEFAULT_MAX_STREAMS: usize = 1024;
pub const DEFAULT_MESSAGE_TIMEOUT: Duration = Duration::from_secs(30);
pub const DEFAULT_INDEX_TIMEOUT: Duration = Duration::from_millis(100);

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            max_streams: DEFAULT_MAX_STREAMS,
            message_timeout: DEFAULT_MESSAGE_TIMEOUT,
            index_timeout: DEFAULT_INDEX_TIMEOUT,
        }
    }
}

/// The pick policy's weights (the example gateway's `--load-penalty` and `--min-match`).
#[derive(Clone, Copy, Debug)]
pub struct Weights {
    /// Matched blocks one request in flight costs.
    pub load_penalty: f64,
    /// Route by the index only when the best match covers this share of the prompt's blocks;
    /// otherwise balance (least loaded).
    pub min_match: f64,
}

impl Default for Weights {
    fn default() -> Self {
        Self { load_penalty: 1.0, min_match: 0.5 }
    }
}

/// How Envoy sends request bodies when the first message does not say
/// (`protocol_config.request_body_mode` wins when present).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BodyMode {
    /// `FULL_DUPLEX_STREAMED`: the GIE configuration.
    #[default]
    FullDuplex,
    /// `BUFFERED`: Envoy waits for the headers answer, then sends the whole body at once.
    Buffered,
}
