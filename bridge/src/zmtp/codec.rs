//! ZMTP 3.x framing without I/O: the greeting, frames, commands and the NULL mechanism's READY
//! metadata, written from the specifications (rfc.zeromq.org 23/ZMTP for 3.0 and 37/ZMTP for
//! 3.1, sections "Formal Grammar", "Framing", "The NULL Security Mechanism", "Connection
//! Metadata", "The Publish-Subscribe Pattern" and "Connection Heartbeating").
//!
//! [`Decoder`] is the only part that reads what a peer sends. Every size a frame header declares
//! is checked against [`Limits`] when the header is complete, before a byte of the body is
//! reserved; a body then grows with the bytes that actually arrive (never past its declared
//! size), so a peer that declares a large frame and stalls holds no more memory than it sent.
//! Over a cap the decoder fails with [`DecodeError::Oversized`]; a frame the grammar does not
//! allow fails with [`DecodeError::Protocol`]. Nothing here panics on any input (property-tested
//! in `bridge/tests/zmtp_codec.rs`, with an allocator that records every allocation's size).

use bytes::Bytes;

/// A greeting's length (signature 10, version 2, mechanism 20, as-server 1, filler 31).
pub const GREETING_LEN: usize = 64;
/// The part of a greeting that tells the protocol version: signature and major version.
pub const GREETING_HEAD: usize = 11;
/// Room for a message's other frames (topic, sequence number, envelope) beside one frame at
/// [`Limits::max_frame`]: [`Limits::new`] caps a message at `max_frame + MESSAGE_ROOM`.
pub const MESSAGE_ROOM: usize = 64 << 10;
/// Frames one message may carry: vLLM and SGLang send 3 (4 in a replay answer).
pub const MAX_FRAMES: usize = 64;
/// Most bytes of one command (READY with its metadata, PING, SUBSCRIBE, ERROR, ...).
pub const MAX_COMMAND: usize = 64 << 10;
/// The first capacity a body is given (or its declared size, if smaller).
const FIRST_CHUNK: usize = 4 << 10;

const FLAG_MORE: u8 = 0x01;
const FLAG_LONG: u8 = 0x02;
const FLAG_COMMAND: u8 = 0x04;
/// Bits 7-3 of the flags octet: "reserved for future use and MUST be zero".
const FLAGS_RESERVED: u8 = 0xF8;

/// The greeting this client sends: ZMTP 3.1, the NULL mechanism, as-server 0.
pub fn greeting() -> [u8; GREETING_LEN] {
    let mut g = [0u8; GREETING_LEN];
    g[0] = 0xFF;
    g[9] = 0x7F;
    g[10] = 3;
    g[11] = 1;
    g[12..16].copy_from_slice(b"NULL");
    g
}

/// The protocol version a peer announced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Version {
    pub major: u8,
    pub minor: u8,
}

impl Version {
    /// ZMTP 3.1 or later: SUBSCRIBE and PING/PONG commands (37/ZMTP).
    pub fn has_commands(self) -> bool {
        self.major > 3 || (self.major == 3 && self.minor >= 1)
    }
}

/// A peer that does not follow the protocol.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    #[error("not a ZMTP peer: greeting signature {0:02x?}")]
    Signature(Vec<u8>),
    #[error("a ZMTP {0}.x peer: this client speaks ZMTP 3.0 and later")]
    Version(u8),
    #[error("security mechanism {0:?}: only NULL is supported")]
    Mechanism(String),
    #[error("frame flags {0:#04x}: reserved bits set, or a command frame with MORE")]
    Flags(u8),
    #[error("a command whose name does not fit in its frame")]
    Command,
    #[error("malformed {0} command")]
    Malformed(&'static str),
    #[error("READY metadata that does not parse (a property past the command's end)")]
    Metadata,
    #[error("expected READY from the peer, got {0}")]
    Handshake(String),
    #[error("the peer's socket type {theirs:?} cannot talk to a {ours} socket")]
    SocketType { ours: &'static str, theirs: String },
    #[error("a READY command after the handshake")]
    ReadyAgain,
    #[error("a message arrived on a socket that only sends")]
    Unexpected,
    #[error("the decoder failed earlier")]
    Failed,
}

/// A declared size over its cap.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{what} of {declared} over the cap of {cap}")]
pub struct Oversized {
    /// "frame bytes", "message bytes", "command bytes" or "frames in a message".
    pub what: &'static str,
    pub declared: u64,
    pub cap: u64,
}

impl Oversized {
    /// A message (a frame, the frames together or their count) rather than a command.
    pub fn is_message(&self) -> bool {
        self.what != "command bytes"
    }
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error(transparent)]
    Protocol(#[from] ProtocolError),
    #[error(transparent)]
    Oversized(#[from] Oversized),
}

/// Checks the first [`GREETING_HEAD`] bytes of a peer's greeting: the signature and a major
/// version of 3 or more (RFC 37, "Version Negotiation": higher versions are accepted).
pub fn check_greeting_head(head: &[u8]) -> Result<(), ProtocolError> {
    let signature = head.first() == Some(&0xFF) && head.get(9).is_some_and(|b| b & 1 == 1);
    if head.len() < GREETING_HEAD || !signature {
        return Err(ProtocolError::Signature(head.iter().copied().take(10).collect()));
    }
    match head[10] {
        major @ 0..=2 => Err(ProtocolError::Version(major)),
        _ => Ok(()),
    }
}

/// Reads a peer's whole greeting: its version, and its mechanism, which must be NULL (RFC 37:
/// "If the mechanism that the peer received does not exactly match the mechanism it sent, it
/// MUST close the connection"). The padding, as-server and filler fields are not interpreted.
pub fn parse_greeting(g: &[u8; GREETING_LEN]) -> Result<Version, ProtocolError> {
    check_greeting_head(g)?;
    let mechanism = &g[12..32];
    let name_len = mechanism.iter().position(|&b| b == 0).unwrap_or(mechanism.len());
    if &mechanism[..name_len] != b"NULL" || mechanism[name_len..].iter().any(|&b| b != 0) {
        return Err(ProtocolError::Mechanism(String::from_utf8_lossy(&mechanism[..name_len]).into_owned()));
    }
    Ok(Version { major: g[10], minor: g[11] })
}

/// The caps a [`Decoder`] checks declared sizes against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Most bytes of one message frame.
    pub max_frame: usize,
    /// Most bytes of one message, its frames together.
    pub max_message: usize,
    /// Most frames of one message.
    pub max_frames: usize,
    /// Most bytes of one command frame.
    pub max_command: usize,
}

impl Limits {
    /// Frames up to `max_frame` bytes, messages up to `max_frame + MESSAGE_ROOM` bytes in at
    /// most [`MAX_FRAMES`] frames, commands up to [`MAX_COMMAND`] bytes.
    pub const fn new(max_frame: usize) -> Self {
        Self {
            max_frame,
            max_message: max_frame.saturating_add(MESSAGE_ROOM),
            max_frames: MAX_FRAMES,
            max_command: MAX_COMMAND,
        }
    }
}

/// A command: its name and data (RFC 37, "Commands").
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Command {
    pub name: Bytes,
    pub data: Bytes,
}

impl Command {
    pub fn is(&self, name: &str) -> bool {
        self.name.as_ref() == name.as_bytes()
    }

    /// The name for messages (lossy, at most 32 characters).
    pub fn display_name(&self) -> String {
        String::from_utf8_lossy(&self.name[..self.name.len().min(32)]).into_owned()
    }
}

/// What a [`Decoder`] produces.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Item {
    /// A whole message, its frames in order (at least one).
    Message(Vec<Bytes>),
    Command(Command),
}

#[derive(Debug)]
enum State {
    /// Waiting for a frame's flags octet.
    Flags,
    /// Reading the size field (1 or 8 octets).
    Size { flags: u8, need: usize, have: usize, buf: [u8; 8] },
    /// Reading a body of `size` octets (already checked against the caps).
    Body { flags: u8, size: usize, body: Vec<u8> },
    /// An error was returned: the connection is to be dropped.
    Failed,
}

/// The incremental frame decoder of one connection (after the greeting).
#[derive(Debug)]
pub struct Decoder {
    limits: Limits,
    state: State,
    /// The frames of the message being read.
    frames: Vec<Bytes>,
    /// Their bytes together.
    message_bytes: usize,
}

impl Decoder {
    pub fn new(limits: Limits) -> Self {
        Self { limits, state: State::Flags, frames: Vec::new(), message_bytes: 0 }
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Changes the caps for what has not been declared yet (a frame already declared keeps the
    /// size it was allowed).
    pub fn set_limits(&mut self, limits: Limits) {
        self.limits = limits;
    }

    /// Bytes the decoder holds: the frames of the message being read and the body being read
    /// (their capacity, not only what is filled).
    pub fn held(&self) -> usize {
        let body = match &self.state {
            State::Body { body, .. } => body.capacity(),
            _ => 0,
        };
        self.message_bytes + body
    }

    /// Consumes bytes from the front of `input` until an item is complete (returned, with
    /// `input` past it) or `input` is used up (`Ok(None)`, everything kept for the next call).
    /// After an error the decoder only returns errors.
    pub fn decode(&mut self, input: &mut &[u8]) -> Result<Option<Item>, DecodeError> {
        loop {
            match &mut self.state {
                State::Failed => return Err(ProtocolError::Failed.into()),
                State::Flags => {
                    let Some((&flags, rest)) = input.split_first() else { return Ok(None) };
                    *input = rest;
                    let command = flags & FLAG_COMMAND != 0;
                    if flags & FLAGS_RESERVED != 0 || (command && flags & FLAG_MORE != 0) {
                        return self.fail(ProtocolError::Flags(flags).into());
                    }
                    let need = if flags & FLAG_LONG != 0 { 8 } else { 1 };
                    self.state = State::Size { flags, need, have: 0, buf: [0; 8] };
                }
                State::Size { flags, need, have, buf } => {
                    let n = (*need - *have).min(input.len());
                    buf[*have..*have + n].copy_from_slice(&input[..n]);
                    *have += n;
                    *input = &input[n..];
                    if *have < *need {
                        return Ok(None);
                    }
                    let declared = buf[..*need].iter().fold(0u64, |acc, &b| (acc << 8) | u64::from(b));
                    let flags = *flags;
                    match self.check(flags, declared) {
                        Ok(size) => self.state = State::Body { flags, size, body: Vec::new() },
                        Err(e) => return self.fail(e),
                    }
                }
                State::Body { size, body, .. } => {
                    take_body(body, *size, input);
                    if body.len() < *size {
                        return Ok(None);
                    }
                    if let State::Body { flags, body, .. } = std::mem::replace(&mut self.state, State::Flags)
                    {
                        if let Some(item) = self.finish(flags, body)? {
                            return Ok(Some(item));
                        }
                    }
                }
            }
        }
    }

    /// A complete frame header: its size if every cap allows it.
    fn check(&self, flags: u8, declared: u64) -> Result<usize, DecodeError> {
        let l = &self.limits;
        let over = |what, declared, cap: usize| Oversized { what, declared, cap: cap as u64 };
        if flags & FLAG_COMMAND != 0 {
            if declared > l.max_command as u64 {
                return Err(over("command bytes", declared, l.max_command).into());
            }
        } else {
            if declared > l.max_frame as u64 {
                return Err(over("frame bytes", declared, l.max_frame).into());
            }
            if self.frames.len() >= l.max_frames {
                return Err(over("frames in a message", self.frames.len() as u64 + 1, l.max_frames).into());
            }
            let message = (self.message_bytes as u64).saturating_add(declared);
            if message > l.max_message as u64 {
                return Err(over("message bytes", message, l.max_message).into());
            }
        }
        // Within a cap that is a usize.
        Ok(declared as usize)
    }

    /// A complete frame: a command, the last frame of a message, or a frame to keep.
    fn finish(&mut self, flags: u8, body: Vec<u8>) -> Result<Option<Item>, DecodeError> {
        if flags & FLAG_COMMAND != 0 {
            return match parse_command(body) {
                Ok(c) => Ok(Some(Item::Command(c))),
                Err(e) => self.fail(e.into()),
            };
        }
        self.message_bytes += body.len();
        self.frames.push(Bytes::from(body));
        if flags & FLAG_MORE != 0 {
            return Ok(None);
        }
        self.message_bytes = 0;
        Ok(Some(Item::Message(std::mem::take(&mut self.frames))))
    }

    fn fail<T>(&mut self, e: DecodeError) -> Result<T, DecodeError> {
        self.state = State::Failed;
        self.frames = Vec::new();
        self.message_bytes = 0;
        Err(e)
    }
}

/// Appends what `input` has of a body of `size` bytes, growing the body's capacity with what
/// arrives (doubling, at least [`FIRST_CHUNK`]) but never past `size`.
fn take_body(body: &mut Vec<u8>, size: usize, input: &mut &[u8]) {
    let n = (size - body.len()).min(input.len());
    if body.capacity() - body.len() < n {
        let grown = (body.capacity() * 2).max(FIRST_CHUNK).max(body.len() + n).min(size);
        body.reserve_exact(grown - body.len());
    }
    body.extend_from_slice(&input[..n]);
    *input = &input[n..];
}

/// A command frame's body: a name of 1 to 255 octets after its size octet, then data.
fn parse_command(body: Vec<u8>) -> Result<Command, ProtocolError> {
    let body = Bytes::from(body);
    let n = usize::from(*body.first().ok_or(ProtocolError::Command)?);
    if n == 0 || body.len() < 1 + n {
        return Err(ProtocolError::Command);
    }
    Ok(Command { name: body.slice(1..1 + n), data: body.slice(1 + n..) })
}

/// The value of property `name` (case-insensitive) in READY metadata, after checking that the
/// whole property list parses: names of 1 to 255 octets, values with a 4-octet big-endian size
/// of at most 2^31 - 1 that fit in the command.
pub fn property<'a>(metadata: &'a [u8], name: &str) -> Result<Option<&'a [u8]>, ProtocolError> {
    let mut rest = metadata;
    let mut found = None;
    while let Some((&n, after)) = rest.split_first() {
        let n = usize::from(n);
        if n == 0 || after.len() < n + 4 {
            return Err(ProtocolError::Metadata);
        }
        let (key, after) = after.split_at(n);
        let (size, after) = after.split_at(4);
        let size = u32::from_be_bytes([size[0], size[1], size[2], size[3]]);
        if size > i32::MAX as u32 || after.len() < size as usize {
            return Err(ProtocolError::Metadata);
        }
        let (value, after) = after.split_at(size as usize);
        if found.is_none() && key.eq_ignore_ascii_case(name.as_bytes()) {
            found = Some(value);
        }
        rest = after;
    }
    Ok(found)
}

/// Appends one frame: flags, a short (one octet) or long (eight octets) size, the body.
pub fn put_frame(out: &mut Vec<u8>, body: &[u8], more: bool, command: bool) {
    let mut flags = if more { FLAG_MORE } else { 0 } | if command { FLAG_COMMAND } else { 0 };
    if let Ok(short) = u8::try_from(body.len()) {
        out.extend_from_slice(&[flags, short]);
    } else {
        flags |= FLAG_LONG;
        out.push(flags);
        out.extend_from_slice(&(body.len() as u64).to_be_bytes());
    }
    out.extend_from_slice(body);
}

/// A message's frames, encoded (MORE on all but the last).
pub fn message(frames: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::with_capacity(frames.iter().map(|f| f.len() + 9).sum());
    for (i, f) in frames.iter().enumerate() {
        put_frame(&mut out, f, i + 1 < frames.len(), false);
    }
    out
}

/// A command frame: `name` (1 to 255 octets) and `data`.
pub fn command(name: &str, data: &[u8]) -> Vec<u8> {
    debug_assert!((1..=255).contains(&name.len()));
    let mut body = Vec::with_capacity(1 + name.len() + data.len());
    body.push(name.len() as u8);
    body.extend_from_slice(name.as_bytes());
    body.extend_from_slice(data);
    let mut out = Vec::with_capacity(body.len() + 9);
    put_frame(&mut out, &body, false, true);
    out
}

/// READY metadata: each property's name (1 to 255 octets) and value.
pub fn metadata(properties: &[(&str, &[u8])]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, value) in properties {
        out.push(name.len() as u8);
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(&(value.len() as u32).to_be_bytes());
        out.extend_from_slice(value);
    }
    out
}

/// The NULL mechanism's READY command for `socket_type`; REQ, DEALER and ROUTER sockets also
/// announce an empty Identity (RFC 37's worked example; the ROUTER then picks one).
pub fn ready(socket_type: &str) -> Vec<u8> {
    let identity = matches!(socket_type, "REQ" | "DEALER" | "ROUTER");
    let mut props: Vec<(&str, &[u8])> = vec![("Socket-Type", socket_type.as_bytes())];
    if identity {
        props.push(("Identity", b""));
    }
    command("READY", &metadata(&props))
}

/// A PING: `ttl` in tenths of a second (0: no hint), up to 16 octets of context.
pub fn ping(ttl: u16, context: &[u8]) -> Vec<u8> {
    let mut data = ttl.to_be_bytes().to_vec();
    data.extend_from_slice(&context[..context.len().min(16)]);
    command("PING", &data)
}

/// The PONG that answers a PING's data (TTL, then context; the context echoed, at most 16
/// octets), or `None` if the PING has no TTL.
pub fn pong_for(ping_data: &[u8]) -> Option<Vec<u8>> {
    let context = ping_data.get(2..)?;
    Some(command("PONG", &context[..context.len().min(16)]))
}

/// A subscription to messages starting with `topic`: the SUBSCRIBE command for a ZMTP 3.1 peer
/// (37/ZMTP, "The Publish-Subscribe Pattern"), the message `0x01 topic` for a 3.0 peer
/// (23/ZMTP). libzmq's PUB and XPUB read both forms from either version.
pub fn subscription(topic: &[u8], peer: Version) -> Vec<u8> {
    if peer.has_commands() {
        command("SUBSCRIBE", topic)
    } else {
        let mut body = Vec::with_capacity(1 + topic.len());
        body.push(1);
        body.extend_from_slice(topic);
        message(&[&body])
    }
}
