//! `prefixlog serve`'s endpoint-picker flags (docs/compat/gie-epp.md): a Gateway API Inference
//! Extension endpoint picker served next to the replica.

use prefixlog_facades::epp::{self, tokenize};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// The GIE endpoint picker (Envoy `ext_proc`).
#[derive(clap::Args, Clone, Debug)]
pub struct EppArgs {
    /// Serve a Gateway API Inference Extension endpoint picker on this address (Envoy's
    /// `envoy.service.ext_proc.v3.ExternalProcessor`; GIE's port is 9002, e.g. 0.0.0.0:9002).
    /// For each request it reads the OpenAI body's `model` and prompt, tokenizes it with the
    /// model's tokenizer (--epp-model), asks this replica which worker holds the longest prefix
    /// and answers the `x-gateway-destination-endpoint` header and `envoy.lb` metadata.
    /// Endpoints are the workers' serving URLs (`prefixlog bridge --serving-url`). Plain gRPC:
    /// bind it where only the gateway reaches it.
    #[arg(long, env = "PREFIXLOG_EPP_ADDR", requires_all = ["epp_health_addr", "epp_model"])]
    pub epp_addr: Option<SocketAddr>,
    /// The picker's gRPC health port (GIE's: 9003): services `liveness` (SERVING while the
    /// process answers), `readiness` and `envoy.service.ext_proc.v3.ExternalProcessor`
    /// (SERVING while this replica is ready).
    #[arg(long, env = "PREFIXLOG_EPP_HEALTH_ADDR", requires = "epp_addr")]
    pub epp_health_addr: Option<SocketAddr>,
    /// A served model and its Hugging Face tokenizer: NAME=PATH/tokenizer.json (repeatable,
    /// or comma separated). NAME is the request's `model`; its blocks are matched in the
    /// replica's keyspace of that model with hash scheme 1. Requests for other models get 404.
    #[arg(long, env = "PREFIXLOG_EPP_MODEL", value_delimiter = ',', value_parser = parse_model)]
    pub epp_model: Vec<(String, PathBuf)>,
    /// Matched blocks that one request in flight at an endpoint costs in the pick.
    #[arg(long, env = "PREFIXLOG_EPP_LOAD_PENALTY", default_value_t = 1.0)]
    pub epp_load_penalty: f64,
    /// Route by the index only when the best match covers this share of the prompt's blocks;
    /// below it, the least-loaded endpoint.
    #[arg(long, env = "PREFIXLOG_EPP_MIN_MATCH", default_value_t = 0.5)]
    pub epp_min_match: f64,
    /// Largest request body the picker buffers; larger requests are answered 413.
    #[arg(long, env = "PREFIXLOG_EPP_MAX_BODY_BYTES", default_value_t = epp::DEFAULT_MAX_BODY_BYTES)]
    pub epp_max_body_bytes: usize,
    /// Requests in flight through the picker (one ext_proc stream each); one more is refused
    /// with RESOURCE_EXHAUSTED and the gateway applies the pool's failure mode.
    #[arg(long, env = "PREFIXLOG_EPP_MAX_STREAMS", default_value_t = epp::DEFAULT_MAX_STREAMS)]
    pub epp_max_streams: usize,
    /// How long the picker waits for the gateway's next message while it reads a request.
    #[arg(long, env = "PREFIXLOG_EPP_MESSAGE_TIMEOUT", default_value = "30s", value_parser = humantime::parse_duration)]
    pub epp_message_timeout: Duration,
    /// How long an index query may take before the picker fails open (least loaded).
    #[arg(long, env = "PREFIXLOG_EPP_INDEX_TIMEOUT", default_value = "100ms", value_parser = humantime::parse_duration)]
    pub epp_index_timeout: Duration,
    /// Request body mode assumed when the gateway does not announce one (newer Envoys do):
    /// `full-duplex` (GIE's FULL_DUPLEX_STREAMED) or `buffered` (BUFFERED).
    #[arg(long, env = "PREFIXLOG_EPP_BODY_MODE", default_value = "full-duplex", value_parser = ["full-duplex", "buffered"])]
    pub epp_body_mode: String,
}

fn parse_model(s: &str) -> Result<(String, PathBuf), String> {
    tokenize::parse_spec(s).map_err(|e| e.to_string())
}

impl EppArgs {
    /// The picker, bound now, when --epp-addr is given.
    pub fn extension(&self) -> anyhow::Result<Option<epp::EppExtension>> {
        let (Some(addr), Some(health)) = (self.epp_addr, self.epp_health_addr) else { return Ok(None) };
        let cfg = epp::EppConfig {
            tokenizers: tokenize::Tokenizers::load(&self.epp_model)?,
            weights: epp::Weights { load_penalty: self.epp_load_penalty, min_match: self.epp_min_match },
            limits: epp::Limits {
                max_body_bytes: self.epp_max_body_bytes,
                max_streams: self.epp_max_streams,
                message_timeout: self.epp_message_timeout,
                index_timeout: self.epp_index_timeout,
            },
            body_mode: if self.epp_body_mode == "buffered" {
                epp::BodyMode::Buffered
            } else {
                epp::BodyMode::FullDuplex
            },
        };
        Ok(Some(epp::EppExtension::bind(addr, health, cfg)?))
    }
}
