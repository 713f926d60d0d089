//! One ZMTP connection: the handshake, then messages in and out, with heartbeats (see the
//! module above for the protocol and its bounds).

use super::codec::{self, Decoder, Item, ProtocolError, Version, GREETING_HEAD, GREETING_LEN};
use super::{Endpoint, Options, Phase, SocketType, ZmtpError};
use bytes::Bytes;
use std::future::Future;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

/// Bytes read from the socket at a time.
const READ_BUF: usize = 64 << 10;

/// Connects over TCP and completes the handshake as a `kind` socket.
pub async fn connect(
    endpoint: &Endpoint,
    kind: SocketType,
    opts: &Options,
) -> Result<Connection<TcpStream>, ZmtpError> {
    let tcp =
        within(opts, Phase::Connect, TcpStream::connect((endpoint.host.as_str(), endpoint.port))).await??;
    tcp.set_nodelay(true)?;
    Connection::handshake(tcp, kind, opts).await
}

/// `f`, or [`ZmtpError::Timeout`] after `opts.timeout`.
async fn within<T>(opts: &Options, phase: Phase, f: impl Future<Output = T>) -> Result<T, ZmtpError> {
    tokio::time::timeout(opts.timeout, f).await.map_err(|_| ZmtpError::Timeout(phase, opts.timeout))
}

/// A connection whose handshake is complete.
pub struct Connection<S> {
    io: S,
    kind: SocketType,
    opts: Options,
    peer: Version,
    decoder: Decoder,
    /// Bytes read and not yet decoded: `rbuf[rpos..rlen]`.
    rbuf: Box<[u8]>,
    rpos: usize,
    rlen: usize,
}

impl<S: AsyncRead + AsyncWrite + Unpin> Connection<S> {
    /// Greets the peer and completes the NULL handshake as a `kind` socket, within
    /// `opts.timeout`.
    pub async fn handshake(io: S, kind: SocketType, opts: &Options) -> Result<Self, ZmtpError> {
        let mut c = Connection {
            io,
            kind,
            opts: *opts,
            peer: Version { major: 3, minor: 0 },
            decoder: Decoder::new(opts.limits),
            rbuf: vec![0; READ_BUF].into_boxed_slice(),
            rpos: 0,
            rlen: 0,
        };
        within(opts, Phase::Handshake, c.greet_and_ready()).await??;
        Ok(c)
    }

    async fn greet_and_ready(&mut self) -> Result<(), ZmtpError> {
        self.io.write_all(&codec::greeting()).await?;
        let mut greeting = [0u8; GREETING_LEN];
        read_exact(&mut self.io, &mut greeting[..GREETING_HEAD]).await?;
        codec::check_greeting_head(&greeting)?;
        read_exact(&mut self.io, &mut greeting[GREETING_HEAD..]).await?;
        self.peer = codec::parse_greeting(&greeting)?;
        self.io.write_all(&codec::ready(self.kind.name())).await?;
        let ready = match self.next_item().await? {
            Item::Command(c) if c.is("READY") => c,
            Item::Command(c) if c.is("ERROR") => return Err(ZmtpError::Refused(error_reason(&c.data))),
            Item::Command(c) => {
                return Err(ProtocolError::Handshake(format!("command {}", c.display_name())).into())
            }
            Item::Message(_) => return Err(ProtocolError::Handshake("a message".into()).into()),
        };
        let theirs = codec::property(&ready.data, "Socket-Type")?.unwrap_or_default();
        if !self.kind.accepts(theirs) {
            let theirs = String::from_utf8_lossy(&theirs[..theirs.len().min(32)]).into_owned();
            return Err(ProtocolError::SocketType { ours: self.kind.name(), theirs }.into());
        }
        Ok(())
    }

    /// The version the peer announced.
    pub fn peer_version(&self) -> Version {
        self.peer
    }

    /// The caps in force.
    pub fn limits(&self) -> codec::Limits {
        self.decoder.limits()
    }

    /// Changes the caps for frames not yet declared (e.g. what is left of a replay's budget).
    pub fn set_limits(&mut self, limits: codec::Limits) {
        self.decoder.set_limits(limits);
    }

    /// Subscribes to messages starting with `topic` (SUB).
    pub async fn subscribe(&mut self, topic: &[u8]) -> Result<(), ZmtpError> {
        let s = codec::subscription(topic, self.peer);
        self.write(&s).await
    }

    /// Sends one message.
    pub async fn send(&mut self, frames: &[&[u8]]) -> Result<(), ZmtpError> {
        let m = codec::message(frames);
        self.write(&m).await
    }

    /// The next message. PINGs are answered on the way; other commands are skipped (an ERROR
    /// ends the connection). With a heartbeat, a PING is sent after that long without traffic,
    /// and the connection fails if nothing arrives within `timeout` after it; only the time
    /// spent in this call counts.
    pub async fn recv(&mut self) -> Result<Vec<Bytes>, ZmtpError> {
        let mut heard = Instant::now();
        let mut pinged: Option<Instant> = None;
        loop {
            if let Some(item) = self.decode_buffered()? {
                match item {
                    Item::Message(m) => return Ok(m),
                    Item::Command(c) => self.on_command(c).await?,
                }
                continue;
            }
            let heartbeat = self.opts.heartbeat.filter(|_| self.peer.has_commands());
            let deadline = match (pinged, heartbeat) {
                (Some(at), _) => Some(at + self.opts.timeout),
                (None, Some(every)) => Some(heard + every),
                (None, None) => None,
            };
            let read = self.io.read(&mut self.rbuf);
            let got = match deadline {
                Some(d) => tokio::time::timeout_at(d, read).await.ok(),
                None => Some(read.await),
            };
            match got {
                Some(Ok(0)) => return Err(ZmtpError::Closed),
                Some(Ok(n)) => {
                    (self.rpos, self.rlen) = (0, n);
                    heard = Instant::now();
                    pinged = None;
                }
                Some(Err(e)) => return Err(e.into()),
                None if pinged.is_some() => {
                    return Err(ZmtpError::Timeout(Phase::Heartbeat, self.opts.timeout))
                }
                None => {
                    self.write(&codec::ping(0, b"")).await?;
                    pinged = Some(Instant::now());
                }
            }
        }
    }

    /// Decodes from what was read; `None` once it is used up without completing an item.
    fn decode_buffered(&mut self) -> Result<Option<Item>, ZmtpError> {
        while self.rpos < self.rlen {
            let mut input = &self.rbuf[self.rpos..self.rlen];
            let item = self.decoder.decode(&mut input);
            self.rpos = self.rlen - input.len();
            if let Some(item) = item? {
                return Ok(Some(item));
            }
        }
        Ok(None)
    }

    /// The next item, reading as needed (the handshake: bounded by its own timeout).
    async fn next_item(&mut self) -> Result<Item, ZmtpError> {
        loop {
            if let Some(item) = self.decode_buffered()? {
                return Ok(item);
            }
            let n = self.io.read(&mut self.rbuf).await?;
            if n == 0 {
                return Err(ZmtpError::Closed);
            }
            (self.rpos, self.rlen) = (0, n);
        }
    }

    async fn on_command(&mut self, c: codec::Command) -> Result<(), ZmtpError> {
        if c.is("PING") {
            let pong = codec::pong_for(&c.data).ok_or(ProtocolError::Malformed("PING"))?;
            self.write(&pong).await
        } else if c.is("ERROR") {
            Err(ZmtpError::Refused(error_reason(&c.data)))
        } else if c.is("READY") {
            Err(ProtocolError::ReadyAgain.into())
        } else {
            // PONG (traffic is what counts), SUBSCRIBE/CANCEL from a peer, unknown commands.
            Ok(())
        }
    }

    async fn write(&mut self, bytes: &[u8]) -> Result<(), ZmtpError> {
        let opts = self.opts;
        within(&opts, Phase::Write, self.io.write_all(bytes)).await??;
        Ok(())
    }
}

/// `read_exact`, with a clean end of stream reported as [`ZmtpError::Closed`].
async fn read_exact<S: AsyncRead + Unpin>(io: &mut S, buf: &mut [u8]) -> Result<(), ZmtpError> {
    match io.read_exact(buf).await {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Err(ZmtpError::Closed),
        Err(e) => Err(e.into()),
    }
}

/// An ERROR command's reason (a size octet, then up to 255 characters), for logs.
fn error_reason(data: &[u8]) -> String {
    let n = data.first().map_or(0, |&n| usize::from(n));
    let reason = data.get(1..).unwrap_or_default();
    String::from_utf8_lossy(&reason[..n.min(reason.len())]).into_owned()
}
