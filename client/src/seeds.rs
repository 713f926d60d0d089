//! Discovery seeds: the endpoints a client asks `Describe`.
//!
//! A seed names a host, and a name may stand for many replicas: a headless Kubernetes Service
//! (or any DNS name with several A/AAAA records) resolves to every pod behind it. Asked as one
//! endpoint, such a name reaches one replica per call — whichever the resolver, or a Service's
//! cluster IP, picks — so the shards behind the other addresses stay unknown and the layout
//! looks incomplete. So before every discovery round each seed's host is resolved ([`expand`])
//! and every address becomes an endpoint of its own. With TLS, an address's certificate is
//! still checked against the seed's host name ([`crate::replicas::ClientTls`]): certificates
//! name the service, not a pod's address.
//!
//! The resolver is injectable ([`Resolver`]): the system's by default ([`system_resolver`]),
//! a fixed table in tests.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use tonic::codegen::http::Uri;

/// Resolves `(host, port)` to socket addresses.
pub type Resolver = Arc<
    dyn Fn(String, u16) -> Pin<Box<dyn Future<Output = io::Result<Vec<SocketAddr>>> + Send>> + Send + Sync,
>;

/// The system's resolver (getaddrinfo through tokio: /etc/hosts, then DNS).
pub fn system_resolver() -> Resolver {
    Arc::new(|host, port| Box::pin(async move { Ok(tokio::net::lookup_host((host, port)).await?.collect()) }))
}

/// A resolver answering from a fixed table (tests, and `host:port` overrides); names not in it
/// fail to resolve.
pub fn static_resolver(table: BTreeMap<String, Vec<IpAddr>>) -> Resolver {
    let table = Arc::new(table);
    Arc::new(move |host, port| {
        let found = table.get(&host).map(|ips| ips.iter().map(|&ip| SocketAddr::new(ip, port)).collect());
        Box::pin(async move {
            found.ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("{host}: not in the table")))
        })
    })
}

/// The endpoints to ask, and for those that are addresses a name resolved to, that name (what
/// a TLS certificate is checked against).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Expanded {
    /// Sorted, without duplicates.
    pub endpoints: Vec<String>,
    pub server_names: BTreeMap<String, String>,
}

/// Every address of every seed, as an endpoint (`scheme://address:port`). A seed whose host is
/// an address, that is not a URL with a host, or whose name does not resolve is kept as it is
/// (its channel resolves it, or fails, on use; a resolver hiccup does not empty the seed list).
pub async fn expand(seeds: &[String], resolver: &Resolver) -> Expanded {
    let mut endpoints = BTreeSet::new();
    let mut server_names = BTreeMap::new();
    for seed in seeds {
        let Some((scheme, host, port)) = split(seed) else {
            endpoints.insert(seed.clone());
            continue;
        };
        if host.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>().is_ok() {
            endpoints.insert(seed.clone());
            continue;
        }
        match resolver(host.clone(), port).await {
            Ok(addrs) if !addrs.is_empty() => {
                for a in addrs {
                    let url = format!("{scheme}://{a}");
                    server_names.insert(url.clone(), host.clone());
                    endpoints.insert(url);
                }
            }
            Ok(_) => {
                tracing::warn!(%seed, "discovery seed resolved to no address; asking it as given");
                endpoints.insert(seed.clone());
            }
            Err(e) => {
                tracing::warn!(%seed, error = %e, "discovery seed did not resolve; asking it as given");
                endpoints.insert(seed.clone());
            }
        }
    }
    Expanded { endpoints: endpoints.into_iter().collect(), server_names }
}

/// (scheme, host, port) of a seed URL; the port defaults to the scheme's.
fn split(seed: &str) -> Option<(String, String, u16)> {
    let uri: Uri = seed.parse().ok()?;
    let scheme = uri.scheme_str()?.to_string();
    let host = uri.host()?.to_string();
    let port = uri.port_u16().or(match scheme.as_str() {
        "http" => Some(80),
        "https" => Some(443),
        _ => None,
    })?;
    Some((scheme, host, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> Resolver {
        let ips = |s: &[&str]| s.iter().map(|a| a.parse().unwrap()).collect::<Vec<IpAddr>>();
        static_resolver(BTreeMap::from([
            ("shards.test".to_string(), ips(&["127.0.0.12", "127.0.0.11", "127.0.0.12"])),
            ("v6.test".to_string(), ips(&["::1"])),
        ]))
    }

    #[tokio::test]
    async fn every_address_of_a_name_is_an_endpoint_named_after_the_seed() {
        let seeds = vec![
            "https://shards.test:50151".to_string(),
            "http://v6.test:7".into(),
            "http://127.0.0.1:9".into(),
            "http://unknown.test:9".into(),
            "not a url".into(),
        ];
        let e = expand(&seeds, &table()).await;
        assert_eq!(
            e.endpoints,
            vec![
                "http://127.0.0.1:9",
                "http://[::1]:7",
                "http://unknown.test:9",
                "https://127.0.0.11:50151",
                "https://127.0.0.12:50151",
                "not a url",
            ]
        );
        assert_eq!(e.server_names["https://127.0.0.11:50151"], "shards.test");
        assert_eq!(e.server_names["http://[::1]:7"], "v6.test");
        assert_eq!(e.server_names.len(), 3, "literal addresses and unresolved names keep their own");
        // The scheme's port when the seed has none.
        let e = expand(&["https://shards.test".to_string()], &table()).await;
        assert_eq!(e.endpoints, vec!["https://127.0.0.11:443", "https://127.0.0.12:443"]);
    }
}
