//! Connection discipline of the HTTP/1 ports (the admin port, the HTTP indexer facade): an
//! accept loop of their own over hyper's HTTP/1 server (axum's `serve` sets no timeouts), so
//! that half-sent requests and idle connections are closed and no one address holds every
//! connection.
//!
//! - A connection must deliver a request's whole header within [`ConnLimits::header_timeout`],
//!   counted from when the server starts waiting for it: the first request of a connection, and
//!   every later one on a kept-alive connection (so the same bound closes idle connections).
//! - At most [`ConnLimits::max_connections`] connections are open, at most
//!   [`ConnLimits::max_connections_per_peer`] from one IP address; one over either is closed at
//!   once, unanswered, and reported to the server's `on_refused` ([`Refused::reason`]:
//!   `connections_total`, `connections_per_peer`).
//! - A connection's read buffer is at most [`READ_BUFFER_BYTES`] (headers larger than it are
//!   refused by hyper with 431).
//!
//! Bodies are bounded by each router (the HTTP facade's middleware), not here.

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

/// Time a client has to send a request's header (and how long a kept-alive connection may idle).
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections open at once by default.
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;
/// Connections open at once from one IP address by default.
pub const DEFAULT_MAX_CONNECTIONS_PER_PEER: usize = 256;
/// Largest read buffer of one connection (hyper's default is 400 KiB).
pub const READ_BUFFER_BYTES: usize = 64 << 10;
/// Pause after a failed accept (out of file descriptors): the loop does not spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// The connection bounds of one server.
#[derive(Clone, Copy, Debug)]
pub struct ConnLimits {
    pub header_timeout: Duration,
    pub max_connections: usize,
    pub max_connections_per_peer: usize,
}

impl Default for ConnLimits {
    fn default() -> Self {
        Self {
            header_timeout: DEFAULT_HEADER_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_connections_per_peer: DEFAULT_MAX_CONNECTIONS_PER_PEER,
        }
    }
}

/// Why a connection was closed at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    Total,
    PerPeer,
}

impl Refused {
    /// The counter label of the refusal.
    pub fn reason(self) -> &'static str {
        match self {
            Self::Total => "connections_total",
            Self::PerPeer => "connections_per_peer",
        }
    }
}

/// Open connections, in all and per peer address.
#[derive(Default)]
struct Open {
    total: usize,
    per_peer: HashMap<IpAddr, usize>,
}

/// The table of open connections of one server; [`Self::admit`] hands out the slots.
#[derive(Clone)]
pub struct Connections {
    limits: ConnLimits,
    open: Arc<Mutex<Open>>,
}

/// One admitted connection: its place is given back when dropped.
pub struct Slot {
    peer: IpAddr,
    open: Arc<Mutex<Open>>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self.open.lock();
        open.total -= 1;
        if let Some(n) = open.per_peer.get_mut(&self.peer) {
            *n -= 1;
            if *n == 0 {
                open.per_peer.remove(&self.peer);
            }
        }
    }
}

impl Connections {
    pub fn new(limits: ConnLimits) -> Self {
        Self { limits, open: Arc::default() }
    }

    /// A slot for a connection from `peer`, or why there is none.
    pub fn admit(&self, peer: IpAddr) -> Result<Slot, Refused> {
        let mut open = self.open.lock();
        if open.total >= self.limits.max_connections {
            return Err(Refused::Total);
        }
        let n = open.per_peer.entry(peer).or_default();
        if *n >= self.limits.max_connections_per_peer {
            return Err(Refused::PerPeer);
        }
        *n += 1;
        open.total += 1;
        Ok(Slot { peer, open: self.open.clone() })
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.open.lock().total
    }
}

/// Told of every connection closed at once.
pub type OnRefused = Arc<dyn Fn(Refused) + Send + Sync>;

/// Serves `app` on `listener` under `limits` until the task is aborted; `name` names the
/// server in logs.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ConnLimits,
    name: &'static str,
    on_refused: OnRefused,
) {
    let connections = Connections::new(limits);
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::warn!(error = %e, server = name, "accept failed");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        let slot = match connections.admit(peer.ip()) {
            Ok(slot) => slot,
            Err(why) => {
                on_refused(why);
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(app.clone());
        tokio::spawn(async move {
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_timeout)
                .max_buf_size(READ_BUFFER_BYTES)
                .serve_connection(TokioIo::new(stream), service)
                .await;
            if let Err(e) = conn {
                tracing::debug!(error = %e, %peer, server = name, "connection closed");
            }
            drop(slot);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(total: usize, per_peer: usize) -> ConnLimits {
        ConnLimits { max_connections: total, max_connections_per_peer: per_peer, ..ConnLimits::default() }
    }

    #[test]
    fn one_peer_cannot_take_more_than_its_share() {
        let c = Connections::new(limits(10, 2));
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let held = [c.admit(a).unwrap(), c.admit(a).unwrap()];
        assert_eq!(c.admit(a).err(), Some(Refused::PerPeer));
        let other = c.admit(b).unwrap();
        assert_eq!(c.open(), 3);
        drop(held);
        assert_eq!(c.open(), 1, "closed connections give their places back");
        let again = c.admit(a).unwrap();
        drop((other, again));
        assert_eq!(c.open(), 0);
    }

    #[test]
    fn the_total_bound_holds_across_peers() {
        let c = Connections::new(limits(2, 2));
        let slots: Vec<Slot> = (1..=2).map(|i| c.admit(IpAddr::from([10, 0, 0, i])).unwrap()).collect();
        assert_eq!(c.admit("10.0.0.9".parse().unwrap()).err(), Some(Refused::Total));
        drop(slots);
        assert!(c.admit("10.0.0.9".parse().unwrap()).is_ok());
    }
}
