//! Why a facade did not start, and the check every facade makes first: the replica must own
//! every partition. Upstream clients ask one index and cannot merge shards' answers, and a
//! facade that writes needs each worker's feed state, which only the replica of its partition
//! has.

use prefixlog_query::extension::ExtensionContext;
use std::net::SocketAddr;

/// Why a facade did not start; `facade` names it with its flag (e.g. `the SMG facade
/// (--smg-radix-index)`).
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("{facade} needs a replica of every partition; this one owns {owned:?} of {partitions}")]
    NotEveryPartition { facade: &'static str, owned: Vec<u32>, partitions: u32 },
    #[error("{facade}: binding its {what} port {addr}: {source}")]
    Bind { facade: &'static str, what: &'static str, addr: SocketAddr, source: std::io::Error },
    #[error("{facade} is already served (the extension was added twice)")]
    AlreadyServed { facade: &'static str },
    #[error("{facade}: registering its metrics: {source}")]
    Metrics { facade: &'static str, source: prometheus::Error },
}

/// `Ok` when the replica behind `ctx` owns every partition of its log.
pub fn every_partition(ctx: &ExtensionContext<'_>, facade: &'static str) -> Result<(), StartError> {
    let info = &ctx.query.view().info;
    if info.owned.len() == info.partition_count as usize {
        return Ok(());
    }
    Err(StartError::NotEveryPartition { facade, owned: info.owned.clone(), partitions: info.partition_count })
}
