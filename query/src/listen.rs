//! Connection discipline of the HTTP/1 ports (the admin port, the HTTP indexer facade): an
//! accept loop of their own over hyper's HTTP/1 server (axum's `serve` sets no timeouts), so
//! that half-sent requests and idle connections are closed and no one address holds every
//! connection. The gRPC query port takes its connections through [`admitted`]: the same caps
//! (its HTTP/2 bounds are set on its server: `crate::server`).
//!
//! - A connection must deliver a request's whole header within [`ConnLimits::header_timeout`],
//!   counted from when the server starts waiting for it: the first request of a connection, and
//!   every later one on a kept-alive connection (so the same bound closes idle connections).
//! - At most [`ConnLimits::max_connections`] connections are open, at most
//!   [`ConnLimits::max_connections_per_peer`] from one IP address; one over either is closed at
//!   once, unanswered, and reported to the server's `on_refused` ([`Refused::reason`]:
//!   `connections_total`, `connections_per_peer`); [`counted_refusals`] counts them in
//!   `prefixlog_connections_refused_total{listener, reason}`.
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
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio_stream::Stream;
use tonic::transport::server::{Connected, TcpConnectInfo};

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

/// The counter of connections closed at once, by listener and [`Refused::reason`].
pub const REFUSED_CONNECTIONS: &str = "prefixlog_connections_refused_total";

/// An [`OnRefused`] that counts each refusal of `listener` in `registry`'s
/// [`REFUSED_CONNECTIONS`] (the listener a constant label, so every listener of a replica
/// shares the family) and logs it at debug. A second registration of one listener in one
/// registry is logged and counted unregistered: a refusal is never left uncounted in memory.
pub fn counted_refusals(registry: &prometheus::Registry, listener: &'static str) -> OnRefused {
    let opts = prometheus::Opts::new(
        REFUSED_CONNECTIONS,
        "Connections closed at once, unanswered, by listener and reason (over the total or the per-address cap)",
    )
    .const_label("listener", listener);
    let counter = prometheus::IntCounterVec::new(opts, &["reason"]).expect("a valid metric definition");
    for why in [Refused::Total, Refused::PerPeer] {
        counter.with_label_values(&[why.reason()]);
    }
    if let Err(e) = registry.register(Box::new(counter.clone())) {
        tracing::warn!(error = %e, listener, "refused connections counted unregistered");
    }
    Arc::new(move |why: Refused| {
        counter.with_label_values(&[why.reason()]).inc();
        tracing::debug!(reason = why.reason(), listener, "connection refused");
    })
}

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

/// A TCP connection admitted by [`Connections`]: its place is given back when it closes.
/// What the gRPC ports serve (tonic's `serve_with_incoming`), TLS or not.
pub struct Admitted {
    stream: tokio::net::TcpStream,
    _slot: Slot,
}

impl AsyncRead for Admitted {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Admitted {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

impl Connected for Admitted {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.stream.connect_info()
    }
}

/// The connections of `listener` that `limits` admit, with `TCP_NODELAY`; the others are
/// closed at once and reported to `on_refused`. Never ends, never yields an error (a failed
/// accept is logged and retried).
pub fn admitted(
    listener: TcpListener,
    limits: ConnLimits,
    name: &'static str,
    on_refused: OnRefused,
) -> impl Stream<Item = std::io::Result<Admitted>> + Send + 'static {
    let connections = Connections::new(limits);
    futures_util::stream::unfold((listener, connections, on_refused), move |state| async move {
        let (listener, connections, on_refused) = state;
        loop {
            let (stream, peer) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(e) => {
                    tracing::warn!(error = %e, server = name, "accept failed");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            };
            match connections.admit(peer.ip()) {
                Ok(slot) => {
                    let _ = stream.set_nodelay(true);
                    let next = Ok(Admitted { stream, _slot: slot });
                    return Some((next, (listener, connections, on_refused)));
                }
                Err(why) => on_refused(why),
            }
        }
    })
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

    #[test]
    fn refusals_are_counted_by_listener_and_reason() {
        let r = prometheus::Registry::new();
        let (query, admin) = (counted_refusals(&r, "query"), counted_refusals(&r, "admin"));
        query(Refused::PerPeer);
        query(Refused::PerPeer);
        admin(Refused::Total);
        let family = r.gather().into_iter().find(|f| f.name() == REFUSED_CONNECTIONS).unwrap();
        let count = |listener: &str, reason: &str| {
            let m = family.get_metric().iter().find(|m| {
                let l = m.get_label();
                l.iter().any(|p| p.name() == "listener" && p.value() == listener)
                    && l.iter().any(|p| p.name() == "reason" && p.value() == reason)
            });
            m.map(|m| m.get_counter().value() as u64)
        };
        assert_eq!(count("query", "connections_per_peer"), Some(2));
        assert_eq!(count("query", "connections_total"), Some(0), "both reasons exported from the start");
        assert_eq!(count("admin", "connections_total"), Some(1));
        assert_eq!(count("admin", "connections_per_peer"), Some(0));
    }

    /// Through [`admitted`]: the second connection from one address over a cap of 1 is closed
    /// at once and reported; the first stays served.
    #[tokio::test]
    async fn a_connection_over_the_per_peer_cap_is_closed_at_once() {
        use futures_util::StreamExt;
        use tokio::io::AsyncReadExt;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let refused = Arc::new(Mutex::new(Vec::new()));
        let seen = refused.clone();
        let on_refused: OnRefused = Arc::new(move |why| seen.lock().push(why));
        let mut incoming = Box::pin(admitted(listener, limits(10, 1), "test", on_refused));
        let _first = tokio::net::TcpStream::connect(addr).await.unwrap();
        let held = incoming.next().await.unwrap().unwrap();
        let mut second = tokio::net::TcpStream::connect(addr).await.unwrap();
        let pending = tokio::spawn(async move { incoming.next().await.map(|r| r.is_ok()) });
        let mut buf = [0u8; 1];
        let n = tokio::time::timeout(Duration::from_secs(5), second.read(&mut buf)).await.unwrap();
        assert!(matches!(n, Ok(0) | Err(_)), "the second connection is closed unanswered");
        assert_eq!(*refused.lock(), vec![Refused::PerPeer]);
        assert!(!pending.is_finished(), "nothing more is admitted");
        pending.abort();
        drop(held);
    }
}
