//! Endpoints: the `ip:port` names Envoy routes to, and the prefixlog workers behind them.
//!
//! The candidate set is the replica's known workers (their `WorkerAdded` metadata, what
//! `ListWorkers` returns) whose serving URL (`serving_url`, as `prefixlog bridge --serving-url`
//! records it) names an IP address and port, and whose `model` entry, when present, is the
//! request's model. Envoy routes to addresses, not names, so a URL with a host name is not an
//! endpoint. Several workers may share one endpoint (a pod replaced under the same address):
//! the endpoint's depth is then the best of theirs.

use super::pb::envoy::config::core::v3::Metadata;
use super::{META_MODEL, META_SERVING_URL, SUBSET_KEY, SUBSET_NAMESPACE};
use prefixlog_query::service::ReplicaView;
use prost_types::value::Kind;
use std::collections::BTreeMap;
use std::net::SocketAddr;

/// Endpoint → the workers serving there (sorted, so picks do not depend on map order).
pub type Candidates = BTreeMap<SocketAddr, Vec<u64>>;

/// `http://10.0.0.5:8000/v1` → `10.0.0.5:8000`; the scheme's port when none is given. None:
/// no IP address (a host name), or not a URL.
pub fn endpoint_of_url(url: &str) -> Option<SocketAddr> {
    let (scheme, rest) = url.split_once("://").unwrap_or(("http", url));
    let authority = rest.split(['/', '?', '#']).next()?;
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    if let Ok(a) = host_port.parse::<SocketAddr>() {
        return Some(a);
    }
    let port = match scheme {
        "https" => 443,
        "http" => 80,
        _ => return None,
    };
    let host = host_port.trim_start_matches('[').trim_end_matches(']');
    host.parse::<std::net::IpAddr>().ok().map(|ip| SocketAddr::new(ip, port))
}

/// The replica's workers that can take a request for `model` (None: any model), by endpoint.
pub fn candidates(view: &ReplicaView, model: Option<&str>) -> Candidates {
    let mut out = Candidates::new();
    let Some(applier) = &view.applier else { return out };
    let a = applier.lock();
    for &p in &view.info.owned {
        for (&w, meta) in &a.partition(p).workers {
            let serves = |m: &String| model.is_none_or(|want| m == want);
            if !meta.get(META_MODEL).is_none_or(serves) {
                continue;
            }
            if let Some(e) = meta.get(META_SERVING_URL).and_then(|u| endpoint_of_url(u)) {
                out.entry(e).or_default().push(w);
            }
        }
    }
    out.values_mut().for_each(|ws| ws.sort_unstable());
    out
}

/// The subset hint of a request, if the data plane sent one: the listed endpoints that parse
/// as `ip:port` (an unparsable entry can name no candidate).
pub fn subset_hint(md: Option<&Metadata>) -> Option<Vec<SocketAddr>> {
    let ns = md?.filter_metadata.get(SUBSET_NAMESPACE)?;
    let value = ns.fields.get(SUBSET_KEY)?;
    let listed = match &value.kind {
        Some(Kind::ListValue(l)) => l.values.iter().filter_map(|v| as_str(&v.kind)).collect(),
        // A single endpoint or a comma-separated list given as one string.
        Some(Kind::StringValue(s)) => s.split(',').map(str::trim).collect(),
        _ => Vec::new(),
    };
    Some(listed.into_iter().filter_map(|s| s.parse().ok()).collect())
}

fn as_str(k: &Option<Kind>) -> Option<&str> {
    match k {
        Some(Kind::StringValue(s)) => Some(s),
        _ => None,
    }
}

/// `candidates` restricted to the hint (when there is one: the picker MUST pick from it).
pub fn restrict(mut candidates: Candidates, hint: Option<&[SocketAddr]>) -> Candidates {
    if let Some(hint) = hint {
        candidates.retain(|e, _| hint.contains(e));
    }
    candidates
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost_types::{ListValue, Struct, Value};

    #[test]
    fn urls_with_an_ip_are_endpoints() {
        let e = |s: &str| endpoint_of_url(s).map(|a| a.to_string());
        assert_eq!(e("http://10.0.0.5:8000"), Some("10.0.0.5:8000".into()));
        assert_eq!(e("http://10.0.0.5:8000/v1?x=1"), Some("10.0.0.5:8000".into()));
        assert_eq!(e("https://u:p@10.0.0.5"), Some("10.0.0.5:443".into()));
        assert_eq!(e("http://[::1]:9"), Some("[::1]:9".into()));
        assert_eq!(e("10.1.2.3:7"), Some("10.1.2.3:7".into()));
        assert_eq!(e("http://vllm-0.svc:8000"), None);
        assert_eq!(e("grpc://10.0.0.5"), None);
    }

    fn hint(v: Value) -> Metadata {
        let s = Struct { fields: [(SUBSET_KEY.to_string(), v)].into_iter().collect() };
        Metadata {
            filter_metadata: [(SUBSET_NAMESPACE.to_string(), s)].into_iter().collect(),
            ..Default::default()
        }
    }

    fn string(s: &str) -> Value {
        Value { kind: Some(Kind::StringValue(s.into())) }
    }

    #[test]
    fn the_subset_hint_is_read_and_restricts() {
        let list = Value {
            kind: Some(Kind::ListValue(ListValue { values: vec![string("1.1.1.1:80"), string("x")] })),
        };
        let h = subset_hint(Some(&hint(list))).unwrap();
        assert_eq!(h, vec!["1.1.1.1:80".parse::<SocketAddr>().unwrap()]);
        let empty = Value { kind: Some(Kind::ListValue(ListValue::default())) };
        assert_eq!(subset_hint(Some(&hint(empty))), Some(vec![]), "present but empty");
        assert_eq!(subset_hint(Some(&Metadata::default())), None);
        assert_eq!(subset_hint(None), None);

        let c: Candidates =
            [("1.1.1.1:80".parse().unwrap(), vec![1]), ("2.2.2.2:80".parse().unwrap(), vec![2])].into();
        assert_eq!(restrict(c.clone(), Some(&h)).len(), 1);
        assert_eq!(restrict(c.clone(), Some(&[])).len(), 0);
        assert_eq!(restrict(c, None).len(), 2);
    }
}
