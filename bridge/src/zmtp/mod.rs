//! A small, bounded ZMTP 3.x client over TCP (tokio): the connecting side of a SUB socket (an
//! engine's KV events) and of a DEALER socket (its replay requests), with the NULL mechanism.
//!
//! Written from the specifications, rfc.zeromq.org 23/ZMTP (ZMTP 3.0) and 37/ZMTP (ZMTP 3.1),
//! not from another implementation:
//! - greeting: the full 64 octets are sent at once ("When a peer does not need backwards
//!   interoperability, it SHOULD send its full greeting immediately"); the peer's signature and
//!   major version are read first, so a ZMTP 1.0/2.0 or non-ZMTP peer is refused without waiting
//!   for 64 octets it will never send; the mechanism must be NULL;
//! - handshake: READY with `Socket-Type` (and an empty `Identity` for DEALER), the peer's READY
//!   whose `Socket-Type` must be a legal peer (SUB: PUB, XPUB; DEALER: REP, DEALER, ROUTER), or
//!   its ERROR;
//! - traffic: frames (flags, short or long size, body), messages of MORE frames, commands;
//!   subscriptions as the SUBSCRIBE command for 3.1 peers and the `0x01 topic` message for 3.0
//!   peers ([`codec::subscription`]); PING answered with PONG; a PING of our own after
//!   [`Options::heartbeat`] without traffic, and the connection dropped if nothing at all
//!   arrives within [`Options::timeout`] after it (TTL 0: the peer is not asked to time us out,
//!   since a bridge busy publishing may pause reading);
//! - bounds ([`codec::Limits`]): each declared frame, message and command size is checked
//!   before anything is reserved for it; over a cap the connection fails with
//!   [`ZmtpError::Oversized`] and the caller reconnects. The handshake, a write and the wait
//!   after a PING are bounded by [`Options::timeout`].
//!
//! Not here: binding, the other socket types, other mechanisms (PLAIN, CURVE), ZMTP 1.0/2.0,
//! IPC and the `Resource` property. libzmq (what vLLM's and SGLang's pyzmq publishers run)
//! accepts everything this client sends.

pub mod codec;
mod conn;

pub use codec::{Limits, Oversized, ProtocolError, Version};
pub use conn::{connect, Connection};
use std::time::Duration;

/// Which socket this client plays.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SocketType {
    Sub,
    Dealer,
}

impl SocketType {
    pub fn name(self) -> &'static str {
        match self {
            SocketType::Sub => "SUB",
            SocketType::Dealer => "DEALER",
        }
    }

    /// Whether a peer announcing `theirs` may talk to this socket (RFC 37, "The Socket-Type
    /// Property"; compared case-insensitively).
    pub fn accepts(self, theirs: &[u8]) -> bool {
        let legal: &[&str] = match self {
            SocketType::Sub => &["PUB", "XPUB"],
            SocketType::Dealer => &["REP", "DEALER", "ROUTER"],
        };
        legal.iter().any(|t| t.as_bytes().eq_ignore_ascii_case(theirs))
    }
}

/// How a connection is bounded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Options {
    pub limits: Limits,
    /// Send a PING after this long without traffic while waiting for a message (`None`: never;
    /// only sent to ZMTP 3.1 peers).
    pub heartbeat: Option<Duration>,
    /// The TCP connect and the handshake each, a write, and the wait for any traffic after a
    /// PING must finish within this.
    pub timeout: Duration,
}

impl Options {
    pub fn new(max_frame: usize) -> Self {
        Self {
            limits: Limits::new(max_frame),
            heartbeat: Some(Duration::from_secs(5)),
            timeout: Duration::from_secs(15),
        }
    }
}

/// What was being waited for when a [`ZmtpError::Timeout`] struck.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Connect,
    Handshake,
    Heartbeat,
    Write,
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Phase::Connect => "connecting",
            Phase::Handshake => "the handshake",
            Phase::Heartbeat => "waiting for traffic after a heartbeat",
            Phase::Write => "a write",
        })
    }
}

/// Why a connection failed or ended.
#[derive(Debug, thiserror::Error)]
pub enum ZmtpError {
    #[error("endpoint {0:?}: {1}")]
    Endpoint(String, &'static str),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("the peer closed the connection")]
    Closed,
    #[error("{0} timed out after {1:?}")]
    Timeout(Phase, Duration),
    #[error("protocol: {0}")]
    Protocol(#[from] ProtocolError),
    #[error("{0}")]
    Oversized(#[from] Oversized),
    #[error("the peer refused the handshake: ERROR {0:?}")]
    Refused(String),
}

impl From<codec::DecodeError> for ZmtpError {
    fn from(e: codec::DecodeError) -> Self {
        match e {
            codec::DecodeError::Protocol(p) => ZmtpError::Protocol(p),
            codec::DecodeError::Oversized(o) => ZmtpError::Oversized(o),
        }
    }
}

/// Why a connection ended, for counting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ending {
    /// A frame, message or command over its cap.
    Oversized,
    /// The peer broke the protocol or refused the handshake.
    Protocol,
    /// Connect, handshake, a write or a heartbeat timed out.
    Timeout,
    /// Closed by the peer, refused, or a socket error.
    Closed,
}

impl Ending {
    pub const ALL: [Ending; 4] = [Ending::Oversized, Ending::Protocol, Ending::Timeout, Ending::Closed];

    pub fn as_str(self) -> &'static str {
        match self {
            Ending::Oversized => "oversized",
            Ending::Protocol => "protocol",
            Ending::Timeout => "timeout",
            Ending::Closed => "closed",
        }
    }
}

impl ZmtpError {
    pub fn ending(&self) -> Ending {
        match self {
            ZmtpError::Oversized(_) => Ending::Oversized,
            ZmtpError::Protocol(_) | ZmtpError::Refused(_) | ZmtpError::Endpoint(..) => Ending::Protocol,
            ZmtpError::Timeout(..) => Ending::Timeout,
            ZmtpError::Io(_) | ZmtpError::Closed => Ending::Closed,
        }
    }
}

/// A `tcp://HOST:PORT` endpoint to connect to: a host name, an IPv4 address or a bracketed
/// IPv6 address, and a port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    pub host: String,
    pub port: u16,
}

impl std::str::FromStr for Endpoint {
    type Err = ZmtpError;

    fn from_str(s: &str) -> Result<Self, ZmtpError> {
        let bad = |why| ZmtpError::Endpoint(s.to_string(), why);
        let t = s.trim();
        let rest = t
            .strip_prefix("tcp://")
            .ok_or_else(|| bad("expected tcp://HOST:PORT (only TCP is supported)"))?;
        let (host, port) = rest.rsplit_once(':').ok_or_else(|| bad("no :PORT"))?;
        let port =
            port.parse::<u16>().ok().filter(|&p| p != 0).ok_or_else(|| bad("the port is not 1-65535"))?;
        let host = match host.strip_prefix('[') {
            Some(v6) => v6.strip_suffix(']').ok_or_else(|| bad("an IPv6 address without its closing ]"))?,
            None if host.contains(':') => {
                return Err(bad("an IPv6 address must be in brackets: tcp://[ADDR]:PORT"))
            }
            None => host,
        };
        if host.is_empty() || host == "*" {
            return Err(bad("no host to connect to (`*` is for binding: name the engine's host)"));
        }
        if host.chars().any(|c| c.is_whitespace() || c == '/' || c == ';') {
            return Err(bad("the host has spaces, a path or a source address (not supported)"));
        }
        Ok(Endpoint { host: host.to_string(), port })
    }
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.host.contains(':') {
            write!(f, "tcp://[{}]:{}", self.host, self.port)
        } else {
            write!(f, "tcp://{}:{}", self.host, self.port)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_parse_and_print() {
        for (text, host, port) in [
            ("tcp://10.0.0.5:5557", "10.0.0.5", 5557),
            (" tcp://engine-0.svc:1 ", "engine-0.svc", 1),
            ("tcp://[::1]:5600", "::1", 5600),
        ] {
            let e: Endpoint = text.parse().unwrap();
            assert_eq!((e.host.as_str(), e.port), (host, port));
            assert_eq!(e.to_string().parse::<Endpoint>().unwrap(), e);
        }
        for bad in [
            "nonsense",
            "ipc:///tmp/x",
            "tcp://h",
            "tcp://h:0",
            "tcp://h:70000",
            "tcp://*:5557",
            "tcp://:5557",
            "tcp://::1:5557",
            "tcp://[::1:5557",
            "tcp://h/x:5",
        ] {
            let e = bad.parse::<Endpoint>().unwrap_err();
            assert!(e.to_string().contains(bad.trim()), "{e}");
        }
    }

    #[test]
    fn socket_types_accept_their_legal_peers_only() {
        assert!(SocketType::Sub.accepts(b"PUB") && SocketType::Sub.accepts(b"xpub"));
        assert!(!SocketType::Sub.accepts(b"ROUTER") && !SocketType::Sub.accepts(b""));
        for peer in ["REP", "DEALER", "ROUTER"] {
            assert!(SocketType::Dealer.accepts(peer.as_bytes()), "{peer}");
        }
        assert!(!SocketType::Dealer.accepts(b"PUB") && !SocketType::Dealer.accepts(b"ROUTERX"));
    }
}
