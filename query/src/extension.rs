//! Services other crates add to the query port (the protocol facades of `prefixlog-facades`).
//!
//! An [`Extension`] is built when the port starts, from the replica the port serves: the
//! [`QueryService`] (so it answers through the same validation, consistency waits and engine
//! read as `PrefixIndex`), the replica's readiness (`grpc.health.v1` reports its service name
//! with the replica's status) and the metrics registry `/metrics` renders. The query crate does
//! not know the extensions; `serve` (or a test) hands them over in [`crate::ServerConfig`].

use crate::service::QueryService;
use std::sync::Arc;
use tonic::service::RoutesBuilder;

/// Why an extension could not be added (its own error type, boxed: the query crate does not
/// know the extensions).
pub type ExtensionError = Box<dyn std::error::Error + Send + Sync>;

/// What an extension is built from.
pub struct ExtensionContext<'a> {
    pub query: &'a QueryService,
    pub registry: &'a prometheus::Registry,
}

/// A gRPC service hosted on the query port next to `prefixlog.v1`.
pub trait Extension: Send + Sync {
    /// The gRPC service name (`package.Service`): reported by `grpc.health.v1` with the
    /// replica's readiness.
    fn service_name(&self) -> &str;
    /// The encoded `FileDescriptorSet` of its schema, listed by server reflection.
    fn file_descriptor_set(&self) -> Option<&'static [u8]> {
        None
    }
    /// Adds the service to the port's routes.
    fn add_to(&self, ctx: &ExtensionContext<'_>, routes: &mut RoutesBuilder) -> Result<(), ExtensionError>;
}

/// The extensions of one query port (none by default).
#[derive(Clone, Default)]
pub struct Extensions(pub Vec<Arc<dyn Extension>>);

impl std::fmt::Debug for Extensions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.0.iter().map(|e| e.service_name())).finish()
    }
}
