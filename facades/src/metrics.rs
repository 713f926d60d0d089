//! Counters of every facade, labelled with the protocol, in the replica's registry (rendered
//! on the admin port's `/metrics` with the replica's other metrics).

use prometheus::{IntCounterVec, Opts, Registry};

/// Requests by protocol, RPC and gRPC status code; upstream actions a facade did not apply,
/// by protocol and reason.
#[derive(Clone)]
pub struct FacadeMetrics {
    requests: IntCounterVec,
    skipped: IntCounterVec,
}

impl FacadeMetrics {
    /// Registers the families in `r`. One instance serves every facade of a registry (a second
    /// registration of the same names would fail).
    pub fn new(r: &Registry) -> prometheus::Result<Self> {
        let requests = IntCounterVec::new(
            Opts::new(
                "prefixlog_facade_requests_total",
                "Requests to a protocol facade by protocol, RPC and gRPC status code",
            ),
            &["protocol", "rpc", "code"],
        )?;
        let skipped = IntCounterVec::new(
            Opts::new(
                "prefixlog_facade_skipped_total",
                "Upstream actions or requests a protocol facade did not apply, by protocol and reason",
            ),
            &["protocol", "reason"],
        )?;
        r.register(Box::new(requests.clone()))?;
        r.register(Box::new(skipped.clone()))?;
        Ok(Self { requests, skipped })
    }

    pub fn request(&self, protocol: &str, rpc: &str, code: tonic::Code) {
        let code = prefixlog_query::metrics::code_name(code);
        self.requests.with_label_values(&[protocol, rpc, code]).inc();
    }

    pub fn skipped(&self, protocol: &str, reason: &str, n: u64) {
        if n > 0 {
            self.skipped.with_label_values(&[protocol, reason]).inc_by(n);
        }
    }

    /// The count of `(protocol, rpc, code)` so far (tests).
    pub fn requests_of(&self, protocol: &str, rpc: &str, code: tonic::Code) -> u64 {
        let code = prefixlog_query::metrics::code_name(code);
        self.requests.with_label_values(&[protocol, rpc, code]).get()
    }

    /// The count of `(protocol, reason)` so far (tests).
    pub fn skipped_of(&self, protocol: &str, reason: &str) -> u64 {
        self.skipped.with_label_values(&[protocol, reason]).get()
    }
}
