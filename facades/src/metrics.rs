//! Counters of every facade, labelled with the protocol, in the replica's registry (rendered
//! on the admin port's `/metrics` with the replica's other metrics).
//!
//! Each facade registers its own collectors with a constant `protocol` label, so several
//! facades of one replica (`--sgl-model` and `--http-indexer-addr`) share the families
//! without colliding in the registry.

use prometheus::{IntCounterVec, Opts, Registry};

/// Requests of one protocol by RPC (or route) and gRPC status code; upstream actions it did
/// not apply, by reason.
#[derive(Clone)]
pub struct FacadeMetrics {
    requests: IntCounterVec,
    skipped: IntCounterVec,
    writer_refused: IntCounterVec,
}

impl FacadeMetrics {
    /// Registers `protocol`'s series in `r` (a second registration of one protocol fails).
    pub fn new(r: &Registry, protocol: &str) -> prometheus::Result<Self> {
        let requests = IntCounterVec::new(
            Opts::new(
                "prefixlog_facade_requests_total",
                "Requests to a protocol facade by protocol, RPC and gRPC status code",
            )
            .const_label("protocol", protocol),
            &["rpc", "code"],
        )?;
        let skipped = IntCounterVec::new(
            Opts::new(
                "prefixlog_facade_skipped_total",
                "Upstream actions or requests a protocol facade did not apply, by protocol and reason",
            )
            .const_label("protocol", protocol),
            &["reason"],
        )?;
        let writer_refused = IntCounterVec::new(
            Opts::new(
                "prefixlog_facade_writer_refused_total",
                "Writes a protocol facade refused to one writer (its quota, a shared per-partition \
                 limit, a name not its own), by protocol, writer and reason",
            )
            .const_label("protocol", protocol),
            &["writer", "reason"],
        )?;
        r.register(Box::new(requests.clone()))?;
        r.register(Box::new(skipped.clone()))?;
        r.register(Box::new(writer_refused.clone()))?;
        Ok(Self { requests, skipped, writer_refused })
    }

    pub fn request(&self, rpc: &str, code: tonic::Code) {
        let code = prefixlog_query::metrics::code_name(code);
        self.requests.with_label_values(&[rpc, code]).inc();
    }

    pub fn skipped(&self, reason: &str, n: u64) {
        if n > 0 {
            self.skipped.with_label_values(&[reason]).inc_by(n);
        }
    }

    /// A write refused to `writer` (its [`crate::writers::Grant::label`]) for `reason`.
    pub fn writer_refused(&self, writer: &str, reason: &str) {
        self.writer_refused.with_label_values(&[writer, reason]).inc();
    }

    /// The count of `(rpc, code)` so far (tests).
    pub fn requests_of(&self, rpc: &str, code: tonic::Code) -> u64 {
        let code = prefixlog_query::metrics::code_name(code);
        self.requests.with_label_values(&[rpc, code]).get()
    }

    /// The count of `reason` so far (tests).
    pub fn skipped_of(&self, reason: &str) -> u64 {
        self.skipped.with_label_values(&[reason]).get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_facades_share_one_registry() {
        let r = Registry::new();
        let a = FacadeMetrics::new(&r, "sglang").unwrap();
        let b = FacadeMetrics::new(&r, "dynamo-http").unwrap();
        a.request("Match", tonic::Code::Ok);
        b.request("query", tonic::Code::NotFound);
        b.request("query", tonic::Code::NotFound);
        let families = r.gather();
        let requests = families.iter().find(|f| f.name() == "prefixlog_facade_requests_total").unwrap();
        assert_eq!(requests.get_metric().len(), 2, "one family, both protocols");
        assert_eq!(
            (a.requests_of("query", tonic::Code::NotFound), b.requests_of("query", tonic::Code::NotFound)),
            (0, 2)
        );
        assert!(FacadeMetrics::new(&r, "sglang").is_err(), "one registration per protocol");
    }
}
