//! Connecting to the log: what the linked librdkafka can do, and why a connection failed.
//!
//! A client with wrong TLS or SASL settings never gets an answer: librdkafka retries the
//! connection and a request only times out ("all brokers are down"). The cause (a certificate
//! that does not verify, a refused password) reaches the client's error callback alone.
//! [`ConnectErrors`] is a client context that keeps it, so a start-up check fails in about a
//! second and names the cause instead of waiting out its timeout with a generic error.

use parking_lot::Mutex;
use rdkafka::client::ClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::ConsumerContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

/// librdkafka features production Kafka needs: TLS, SASL PLAIN / SCRAM / OAUTHBEARER, and every
/// compression codec a producer may have used (a consumer must decode what it is given).
pub const REQUIRED_FEATURES: [&str; 8] =
    ["ssl", "sasl_plain", "sasl_scram", "sasl_oauthbearer", "gzip", "snappy", "lz4", "zstd"];

/// librdkafka's version and its `builtin.features` (what it was compiled with).
pub fn librdkafka_build() -> (String, Vec<String>) {
    let (_, version) = rdkafka::util::get_rdkafka_version();
    let features = ClientConfig::new()
        .create_native_config()
        .and_then(|c| c.get("builtin.features"))
        .map(|f| f.split(',').map(str::to_string).collect())
        .unwrap_or_default();
    (version, features)
}

/// One failure librdkafka reported to a client.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientFailure {
    pub code: RDKafkaErrorCode,
    /// librdkafka's own words, e.g. `ssl://host:9093/bootstrap: SSL handshake failed: ...
    /// certificate verify failed ...`.
    pub reason: String,
}

impl ClientFailure {
    /// A misconfiguration retrying cannot cure: TLS (a certificate that does not verify, a TLS
    /// client on a plaintext port) or SASL (bad credentials, a mechanism the broker lacks).
    /// A refused or dropped connection is not: the broker may be starting.
    pub fn is_conclusive(&self) -> bool {
        matches!(
            self.code,
            RDKafkaErrorCode::SSL
                | RDKafkaErrorCode::Authentication
                | RDKafkaErrorCode::SaslAuthenticationFailed
                | RDKafkaErrorCode::UnsupportedSASLMechanism
                | RDKafkaErrorCode::IllegalSASLState
        )
    }
}

/// A client context that keeps the last failure librdkafka reported (and the first conclusive
/// one), and logs them as the default context does.
#[derive(Default)]
pub struct ConnectErrors {
    last: Mutex<Option<ClientFailure>>,
    conclusive: Mutex<Option<ClientFailure>>,
}

impl ConnectErrors {
    /// The last failure reported that says why (an "all brokers are down" only when nothing
    /// else was reported).
    pub fn last(&self) -> Option<ClientFailure> {
        self.last.lock().clone()
    }

    /// The first failure that retrying cannot cure, if any.
    pub fn conclusive(&self) -> Option<ClientFailure> {
        self.conclusive.lock().clone()
    }
}

impl ClientContext for ConnectErrors {
    fn error(&self, error: KafkaError, reason: &str) {
        tracing::warn!(target: "librdkafka", error = %error, "{reason}");
        let Some(code) = error.rdkafka_error_code() else { return };
        let failure = ClientFailure { code, reason: reason.to_string() };
        if failure.is_conclusive() {
            self.conclusive.lock().get_or_insert_with(|| failure.clone());
        }
        // "1/1 brokers are down" follows every failed connection and says nothing of why.
        if code != RDKafkaErrorCode::AllBrokersDown || self.last.lock().is_none() {
            *self.last.lock() = Some(failure);
        }
    }
}

impl ConsumerContext for ConnectErrors {}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fails when a build drops TLS, SASL or a codec (rdkafka's `ssl` / `zstd` features, or a
    /// librdkafka built without OpenSSL): production Kafka would be unreachable or unreadable.
    #[test]
    fn librdkafka_has_tls_sasl_and_every_codec() {
        let (version, features) = librdkafka_build();
        let missing: Vec<&str> =
            REQUIRED_FEATURES.into_iter().filter(|f| !features.iter().any(|have| have == f)).collect();
        assert!(missing.is_empty(), "librdkafka {version} lacks {missing:?} (has {features:?})");
    }

    #[test]
    fn tls_and_sasl_failures_are_conclusive_transport_ones_are_not() {
        let f = |code| ClientFailure { code, reason: String::new() };
        assert!(f(RDKafkaErrorCode::SSL).is_conclusive());
        assert!(f(RDKafkaErrorCode::Authentication).is_conclusive());
        assert!(!f(RDKafkaErrorCode::BrokerTransportFailure).is_conclusive());
        assert!(!f(RDKafkaErrorCode::AllBrokersDown).is_conclusive());
        let ctx = ConnectErrors::default();
        ctx.error(KafkaError::Global(RDKafkaErrorCode::Authentication), "SASL authentication error: bad");
        ctx.error(KafkaError::Global(RDKafkaErrorCode::AllBrokersDown), "1/1 brokers are down");
        assert_eq!(ctx.conclusive().unwrap().reason, "SASL authentication error: bad");
        assert_eq!(ctx.last().unwrap().code, RDKafkaErrorCode::Authentication, "the reason, not its echo");
        ctx.error(KafkaError::Global(RDKafkaErrorCode::BrokerTransportFailure), "Connection refused");
        assert_eq!(ctx.last().unwrap().reason, "Connection refused");
    }
}
