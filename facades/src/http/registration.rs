//! A Dynamo `/register`ed instance as the log records it: its worker's `WorkerAdded` metadata
//! (pure: no I/O). The log is the truth for registrations as for everything else: every
//! replica applies the same records, so every replica knows which instances are registered,
//! under which model, routing group and block size, which engine endpoint feeds each of their
//! dp ranks, and which replica subscribes to them (the *registrar*, the only writer of their
//! feeds: [`super::listeners`]).
//!
//! Keys (besides `model`, `block_size` and `routing_group`, which the facades read for every
//! worker): [`META_REGISTRAR`] (the replica id that accepted the registration and runs its
//! subscriptions), `dynamo.endpoint.<dp>` and `dynamo.replay_endpoint.<dp>` per rank, and
//! `kv_events_endpoint` (the endpoints in rank order, as `prefixlog bridge` writes it, for
//! `ListWorkers` clients).

use super::{META_BLOCK_SIZE, META_KV_EVENTS, META_MODEL, META_ROUTING_GROUP};
use prefixlog_engine::scheme::SCHEME_DYNAMO_BLOCK;
use prefixlog_engine::KeyspaceId;
use std::collections::BTreeMap;

/// The metadata key naming the replica that accepted the registration and feeds it.
pub const META_REGISTRAR: &str = "dynamo.registrar";
/// Prefix of a rank's engine endpoint key (`dynamo.endpoint.0`).
pub const META_ENDPOINT: &str = "dynamo.endpoint.";
/// Prefix of a rank's replay endpoint key (`dynamo.replay_endpoint.0`).
pub const META_REPLAY: &str = "dynamo.replay_endpoint.";

/// One dp rank's engine stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rank {
    pub endpoint: String,
    pub replay: Option<String>,
}

/// A registered instance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Registration {
    pub model: String,
    pub group: String,
    pub block_size: u32,
    /// The replica id that subscribes to its engines.
    pub registrar: String,
    pub ranks: BTreeMap<u32, Rank>,
}

impl Registration {
    pub fn new(model: &str, group: &str, block_size: u32, registrar: &str) -> Self {
        Self {
            model: model.to_string(),
            group: group.to_string(),
            block_size,
            registrar: registrar.to_string(),
            ranks: BTreeMap::new(),
        }
    }

    /// The registration a worker's metadata records, if it records one (the registrar key is
    /// present; a worker announced by `prefixlog bridge` or another publisher has none).
    pub fn from_meta(meta: &BTreeMap<String, String>) -> Option<Self> {
        let registrar = meta.get(META_REGISTRAR)?.clone();
        let get = |k: &str| meta.get(k).cloned().unwrap_or_default();
        let mut ranks = BTreeMap::new();
        for (k, endpoint) in meta {
            let Some(dp) = k.strip_prefix(META_ENDPOINT).and_then(|d| d.parse::<u32>().ok()) else {
                continue;
            };
            let replay = meta.get(&format!("{META_REPLAY}{dp}")).cloned();
            ranks.insert(dp, Rank { endpoint: endpoint.clone(), replay });
        }
        Some(Self {
            model: get(META_MODEL),
            group: meta
                .get(META_ROUTING_GROUP)
                .cloned()
                .unwrap_or_else(|| super::DEFAULT_ROUTING_GROUP.into()),
            block_size: get(META_BLOCK_SIZE).parse().unwrap_or(0),
            registrar,
            ranks,
        })
    }

    /// The metadata recording it ([`Self::from_meta`] reads it back unchanged).
    pub fn to_meta(&self) -> BTreeMap<String, String> {
        let mut m = BTreeMap::from([
            (META_MODEL.to_string(), self.model.clone()),
            (META_BLOCK_SIZE.to_string(), self.block_size.to_string()),
            (META_ROUTING_GROUP.to_string(), self.group.clone()),
            (META_REGISTRAR.to_string(), self.registrar.clone()),
        ]);
        for (dp, r) in &self.ranks {
            m.insert(format!("{META_ENDPOINT}{dp}"), r.endpoint.clone());
            if let Some(replay) = &r.replay {
                m.insert(format!("{META_REPLAY}{dp}"), replay.clone());
            }
        }
        let endpoints: Vec<&str> = self.ranks.values().map(|r| r.endpoint.as_str()).collect();
        if !endpoints.is_empty() {
            m.insert(META_KV_EVENTS.to_string(), endpoints.join(","));
        }
        m
    }

    /// The keyspace its engines' blocks are filed in: Dynamo's hash scheme, so the keyspace
    /// holds the block hashes upstream's indexer holds and answers `/query_by_hash`.
    pub fn keyspace(&self) -> KeyspaceId {
        KeyspaceId::new(self.model.clone(), self.block_size, SCHEME_DYNAMO_BLOCK)
    }
}

/// Upstream's check of a ZeroMQ endpoint (`validate_endpoint` of Dynamo's services, read from
/// its source), with its wording: `scheme://address`, where a `tcp` address is `host:port`
/// (an IPv6 host in brackets, a port that parses as u16) and `ipc`/`inproc` take any address.
pub fn validate_endpoint(endpoint: &str) -> Result<(), String> {
    let bad = |why: &str| Err(format!("invalid ZMQ endpoint `{endpoint}`: {why}"));
    let Some((scheme, address)) = endpoint.split_once("://") else { return bad("missing scheme") };
    if address.is_empty() {
        return bad("missing address");
    }
    match scheme {
        "tcp" => {
            let Some((host, port)) = address.rsplit_once(':') else { return bad("missing TCP port") };
            if host.is_empty() {
                return bad("missing TCP host");
            }
            if host.starts_with('[') && !host.ends_with(']') {
                return bad("missing closing `]`");
            }
            if !host.starts_with('[') && host.contains(':') {
                return bad("missing TCP port");
            }
            match port.parse::<u16>() {
                Ok(_) => Ok(()),
                Err(e) => bad(&format!("invalid TCP port: {e}")),
            }
        }
        "ipc" | "inproc" => Ok(()),
        other => bad(&format!("unsupported scheme `{other}`")),
    }
}

/// Upstream's check of a registration's endpoints: the replay endpoint's error is prefixed
/// with which endpoint it is about.
pub fn validate_endpoints(endpoint: &str, replay: Option<&str>) -> Result<(), String> {
    validate_endpoint(endpoint)?;
    if let Some(r) = replay {
        validate_endpoint(r).map_err(|e| format!("invalid replay endpoint `{r}`: {e}"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_round_trips_and_lists_endpoints_in_rank_order() {
        let mut r = Registration::new("llama", "blue", 16, "replica-a");
        r.ranks.insert(1, Rank { endpoint: "tcp://h:5558".into(), replay: Some("tcp://h:5601".into()) });
        r.ranks.insert(0, Rank { endpoint: "tcp://h:5557".into(), replay: None });
        let m = r.to_meta();
        assert_eq!(m["kv_events_endpoint"], "tcp://h:5557,tcp://h:5558");
        assert_eq!(
            (m["model"].as_str(), m["block_size"].as_str(), m["routing_group"].as_str()),
            ("llama", "16", "blue")
        );
        assert_eq!(Registration::from_meta(&m), Some(r.clone()));
        assert_eq!(r.keyspace(), KeyspaceId::new("llama", 16, 2));
    }

    #[test]
    fn a_worker_without_a_registrar_is_no_registration() {
        let bridge = BTreeMap::from([("model".to_string(), "m".to_string())]);
        assert_eq!(Registration::from_meta(&bridge), None);
    }

    #[test]
    fn endpoints_are_checked_with_upstreams_words() {
        for ok in ["tcp://127.0.0.1:5557", "tcp://*:5558", "tcp://[::1]:1", "ipc:///tmp/x", "inproc://l"] {
            assert_eq!(validate_endpoint(ok), Ok(()), "{ok}");
        }
        let err = |e: &str| validate_endpoint(e).unwrap_err();
        assert_eq!(err("nope"), "invalid ZMQ endpoint `nope`: missing scheme");
        assert_eq!(err("tcp://"), "invalid ZMQ endpoint `tcp://`: missing address");
        assert_eq!(err("tcp://host"), "invalid ZMQ endpoint `tcp://host`: missing TCP port");
        assert_eq!(err("tcp://:1"), "invalid ZMQ endpoint `tcp://:1`: missing TCP host");
        assert_eq!(err("tcp://[::1:1"), "invalid ZMQ endpoint `tcp://[::1:1`: missing closing `]`");
        assert_eq!(err("tcp://::1:5"), "invalid ZMQ endpoint `tcp://::1:5`: missing TCP port");
        assert_eq!(
            err("tcp://h:x"),
            "invalid ZMQ endpoint `tcp://h:x`: invalid TCP port: invalid digit found in string"
        );
        assert_eq!(err("udp://h:1"), "invalid ZMQ endpoint `udp://h:1`: unsupported scheme `udp`");
        let replay = validate_endpoints("tcp://h:1", Some("x")).unwrap_err();
        assert_eq!(replay, "invalid replay endpoint `x`: invalid ZMQ endpoint `x`: missing scheme");
    }
}
