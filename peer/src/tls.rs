//! Mutual TLS on the peer port: the checkpoint stream is the whole index, and digests reveal
//! its shape, so replicas can require each other to present certificates signed by one CA.
//! A replica is both server (its peer service) and client (anti-entropy, bootstrap, recovery)
//! there, so one certificate with both the serverAuth and clientAuth usages serves both.

use std::path::Path;
use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};

/// The PEM material of a replica's peer-port identity and the CA its peers are signed by.
#[derive(Clone, Debug)]
pub struct PeerTls {
    cert: Vec<u8>,
    key: Vec<u8>,
    ca: Vec<u8>,
}

#[derive(Debug, thiserror::Error)]
#[error("peer TLS: reading {path}: {source}")]
pub struct PeerTlsError {
    path: String,
    source: std::io::Error,
}

fn read(p: &Path) -> Result<Vec<u8>, PeerTlsError> {
    std::fs::read(p).map_err(|source| PeerTlsError { path: p.display().to_string(), source })
}

impl PeerTls {
    pub fn load(cert: &Path, key: &Path, ca: &Path) -> Result<Self, PeerTlsError> {
        Ok(Self { cert: read(cert)?, key: read(key)?, ca: read(ca)? })
    }

    /// The peer service: this replica's identity; clients must present a certificate of the CA.
    pub fn server(&self) -> ServerTlsConfig {
        ServerTlsConfig::new()
            .identity(Identity::from_pem(&self.cert, &self.key))
            .client_ca_root(Certificate::from_pem(&self.ca))
    }

    /// Calls to peers: trust the CA, present this replica's identity.
    pub fn client(&self) -> ClientTlsConfig {
        ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&self.ca))
            .identity(Identity::from_pem(&self.cert, &self.key))
    }
}
