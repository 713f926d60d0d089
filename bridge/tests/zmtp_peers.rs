//! The bridge's ZMTP client (`prefixlog_bridge::zmtp`) against raw TCP peers written byte by
//! byte here: a well-behaved ZMTP 3.1 and 3.0 publisher (the subscription's two forms), a
//! ROUTER answering a replay request, heartbeats both ways, and hostile peers — garbage or old
//! greetings, other mechanisms and socket types, ERROR, a 2^62-byte frame, a huge command,
//! endless MORE frames, a peer that stalls mid-frame or closes — each of which must end the
//! connection with the matching error, promptly and without reserving what was declared.
//! Interop with libzmq itself is tested end to end (tests/tests/bridge.rs with pyzmq, the
//! upstream leg with vLLM's publisher).

use prefixlog_bridge::replay::{request_replay, ReplayError, ReplayLimits};
use prefixlog_bridge::zmtp::codec::{self, Decoder, Item, Limits};
use prefixlog_bridge::zmtp::{self, Ending, Endpoint, Phase, ProtocolError, SocketType, ZmtpError};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Every wait in these tests is bounded by this (a loaded CI machine), with a message.
const BOUND: Duration = Duration::from_secs(30);

async fn bounded<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(BOUND, f).await.unwrap_or_else(|_| panic!("{what}: not within {BOUND:?}"))
}

fn opts() -> zmtp::Options {
    zmtp::Options { limits: Limits::new(1 << 20), heartbeat: None, timeout: BOUND }
}

/// A listener and the endpoint to reach it.
async fn listen() -> (TcpListener, Endpoint) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let e = format!("tcp://{}", l.local_addr().unwrap()).parse().unwrap();
    (l, e)
}

/// The server side of one connection, after the handshake: raw bytes from here on.
struct Peer {
    tcp: TcpStream,
    decoder: Decoder,
    /// The client's greeting.
    greeting: [u8; codec::GREETING_LEN],
}

impl Peer {
    /// Accepts one client and completes the handshake as a `socket_type` socket announcing
    /// ZMTP 3.`minor`; returns the client's READY too.
    async fn accept(l: &TcpListener, minor: u8, socket_type: &str) -> (Peer, codec::Command) {
        let (mut tcp, _) = l.accept().await.unwrap();
        let mut g = codec::greeting();
        g[11] = minor;
        tcp.write_all(&g).await.unwrap();
        let mut greeting = [0u8; codec::GREETING_LEN];
        tcp.read_exact(&mut greeting).await.unwrap();
        let mut p = Peer { tcp, decoder: Decoder::new(Limits::new(1 << 20)), greeting };
        let Item::Command(ready) = p.item().await else { panic!("the client's first frame is not READY") };
        p.tcp.write_all(&codec::ready(socket_type)).await.unwrap();
        (p, ready)
    }

    /// The next item the client sends.
    async fn item(&mut self) -> Item {
        let mut buf = [0u8; 4096];
        loop {
            let n = self.tcp.read(&mut buf).await.unwrap();
            assert!(n > 0, "the client closed");
            let mut input = &buf[..n];
            if let Some(item) = self.decoder.decode(&mut input).unwrap() {
                assert!(input.is_empty(), "one item at a time in these tests");
                return item;
            }
        }
    }
}

/// Connects as `kind` while `server` plays the peer; returns the client's result and the
/// server's.
async fn with_peer<T, F>(
    kind: SocketType,
    opts: zmtp::Options,
    server: impl FnOnce(TcpListener) -> F,
) -> (Result<zmtp::Connection<TcpStream>, ZmtpError>, T)
where
    F: std::future::Future<Output = T>,
{
    let (l, e) = listen().await;
    bounded("client and peer", async { tokio::join!(zmtp::connect(&e, kind, &opts), server(l)) }).await
}

#[tokio::test]
async fn a_sub_subscribes_with_the_command_to_31_and_the_message_to_30() {
    for (minor, want) in [
        (1u8, codec::subscription(b"kv", zmtp::Version { major: 3, minor: 1 })),
        (0, vec![0, 3, 1, b'k', b'v']),
    ] {
        let (l, e) = listen().await;
        let client = tokio::spawn(async move {
            let mut c = zmtp::connect(&e, SocketType::Sub, &opts()).await.unwrap();
            assert_eq!(c.peer_version().minor, minor);
            c.subscribe(b"kv").await.unwrap();
            c.recv().await.unwrap()
        });
        let (mut peer, ready) = bounded("handshake", Peer::accept(&l, minor, "PUB")).await;
        assert_eq!(&peer.greeting[..12], &codec::greeting()[..12], "the client speaks 3.1");
        assert!(ready.is("READY"));
        assert_eq!(codec::property(&ready.data, "Socket-Type"), Ok(Some(&b"SUB"[..])));
        assert_eq!(codec::property(&ready.data, "Identity"), Ok(None));
        let sub = bounded("subscription", peer.item()).await;
        let want_item = Decoder::new(Limits::new(100)).decode(&mut &want[..]).unwrap().unwrap();
        assert_eq!(sub, want_item, "3.{minor}");
        let m = codec::message(&[b"kv", &9u64.to_be_bytes(), b"payload"]);
        peer.tcp.write_all(&m).await.unwrap();
        let frames = bounded("message", client).await.unwrap();
        assert_eq!(frames, [&b"kv"[..], &9u64.to_be_bytes(), b"payload"]);
    }
}

#[tokio::test]
async fn heartbeats_are_answered_and_sent_and_silence_ends_the_connection() {
    let (l, e) = listen().await;
    let mut o = opts();
    (o.heartbeat, o.timeout) = (Some(Duration::from_millis(50)), Duration::from_millis(200));
    let client = tokio::spawn(async move {
        let mut c = zmtp::connect(&e, SocketType::Sub, &o).await?;
        c.recv().await
    });
    let (mut peer, _) = bounded("handshake", Peer::accept(&l, 1, "XPUB")).await;
    // Our PING: answered with its context.
    peer.tcp.write_all(&codec::ping(30, b"abc")).await.unwrap();
    let pong = bounded("PONG", peer.item()).await;
    assert_eq!(pong, Item::Command(codec::Command { name: "PONG".into(), data: "abc".into() }));
    // The client's PING after 50 ms of silence, with no TTL asked of us.
    let ping = bounded("PING", peer.item()).await;
    assert!(matches!(&ping, Item::Command(c) if c.is("PING") && c.data.as_ref() == [0, 0]), "{ping:?}");
    // Unanswered: the connection ends within the timeout.
    let r = bounded("heartbeat timeout", client).await.unwrap();
    assert!(matches!(r, Err(ZmtpError::Timeout(Phase::Heartbeat, _))), "{r:?}");
}

#[tokio::test]
async fn a_dealer_sends_a_request_and_reads_a_replay_answer_within_its_budget() {
    let (l, e) = listen().await;
    let limits = |max_bytes| ReplayLimits {
        timeout: BOUND,
        max_bytes,
        max_frame_bytes: 1 << 20,
        topic: b"kv".to_vec(),
    };
    let server = tokio::spawn(async move {
        for _ in 0..2 {
            let (mut peer, ready) = Peer::accept(&l, 1, "ROUTER").await;
            assert_eq!(codec::property(&ready.data, "Socket-Type"), Ok(Some(&b"DEALER"[..])));
            assert_eq!(codec::property(&ready.data, "Identity"), Ok(Some(&b""[..])));
            let req = peer.item().await;
            assert_eq!(
                req,
                Item::Message(vec![bytes::Bytes::new(), bytes::Bytes::copy_from_slice(&3u64.to_be_bytes())])
            );
            let mut answer = Vec::new();
            for (topic, seq) in [(&b"kv"[..], 3u64), (b"other", 4), (b"kv", 5)] {
                answer.extend(codec::message(&[b"", topic, &seq.to_be_bytes(), &[7u8; 100]]));
            }
            answer.extend(codec::message(&[b"", b"", &[0xFF; 8], b""]));
            peer.tcp.write_all(&answer).await.unwrap();
        }
    });
    let got = bounded("replay", request_replay(&e.to_string(), 3, &limits(10_000))).await.unwrap();
    assert_eq!(got.iter().map(|(s, p)| (*s, p.len())).collect::<Vec<_>>(), [(3, 100), (5, 100)]);
    // The same answer within 250 bytes: over the budget at its third message, before reading it.
    let e = bounded("replay", request_replay(&e.to_string(), 3, &limits(250))).await.unwrap_err();
    assert!(matches!(e, ReplayError::TooLarge(250)) && e.is_oversized(), "{e}");
    server.await.unwrap();
}

/// A peer that sends `bytes` after greeting (and, with `handshake`, completing the handshake as
/// a PUB), then holds the connection open without reading.
async fn hostile(handshake: bool, bytes: Vec<u8>, o: zmtp::Options) -> ZmtpError {
    let (l, e) = listen().await;
    let client = tokio::spawn(async move {
        let mut c = zmtp::connect(&e, SocketType::Sub, &o).await?;
        c.subscribe(b"").await?;
        c.recv().await
    });
    let server = tokio::spawn(async move {
        let mut tcp =
            if handshake { Peer::accept(&l, 1, "PUB").await.0.tcp } else { l.accept().await.unwrap().0 };
        let _ = tcp.write_all(&bytes).await;
        tokio::time::sleep(BOUND * 2).await;
    });
    let r = bounded("the client's verdict", client).await.unwrap();
    server.abort();
    r.expect_err("a hostile peer ends the connection")
}

#[tokio::test]
async fn hostile_peers_end_the_connection_with_the_matching_error() {
    let long = |flags: u8, size: u64| [&[flags][..], &size.to_be_bytes()].concat();
    let mut wrong_mech = codec::greeting();
    wrong_mech[12..17].copy_from_slice(b"CURVE");
    let cases: Vec<(&str, bool, Vec<u8>, Ending)> = vec![
        ("a 2^62-byte frame", true, long(0x02, 1 << 62), Ending::Oversized),
        (
            "a 2^62-byte frame amid a message",
            true,
            [vec![0x01, 1, b'a', 0x01, 1, b'b'], long(0x02, 1 << 62)].concat(),
            Ending::Oversized,
        ),
        ("a 2^40-byte command", true, long(0x06, 1 << 40), Ending::Oversized),
        ("endless MORE frames", true, [0x01, 0].repeat(10_000), Ending::Oversized),
        (
            "an HTTP response for a greeting",
            false,
            b"HTTP/1.1 400 Bad Request\r\n\r\n".to_vec(),
            Ending::Protocol,
        ),
        (
            "a ZMTP 2.0 greeting",
            false,
            [&[0xFF, 0, 0, 0, 0, 0, 0, 0, 1, 0x7F, 1][..], &[5u8; 20]].concat(),
            Ending::Protocol,
        ),
        ("the CURVE mechanism", false, wrong_mech.to_vec(), Ending::Protocol),
        ("reserved flag bits", true, vec![0x40, 0], Ending::Protocol),
        ("a second READY", true, codec::ready("PUB"), Ending::Protocol),
        ("ERROR after READY", true, codec::command("ERROR", b"\x04nope"), Ending::Protocol),
        ("a malformed PING", true, codec::command("PING", b"\x01"), Ending::Protocol),
        ("a close mid-frame", true, vec![0x00, 200, 1, 2, 3], Ending::Closed),
    ];
    for (what, handshake, bytes, ending) in cases {
        let close = ending == Ending::Closed;
        let e = if close {
            let (l, e) = listen().await;
            let server = tokio::spawn(async move {
                let (mut peer, _) = Peer::accept(&l, 1, "PUB").await;
                peer.tcp.write_all(&bytes).await.unwrap();
            });
            let r = bounded(what, async {
                zmtp::connect(&e, SocketType::Sub, &opts()).await.unwrap().recv().await
            })
            .await;
            server.await.unwrap();
            r.unwrap_err()
        } else {
            hostile(handshake, bytes, opts()).await
        };
        assert_eq!(e.ending(), ending, "{what}: {e}");
        if what.contains("2^62") {
            assert!(
                e.to_string().contains("frame bytes of 4611686018427387904 over the cap of 1048576"),
                "{e}"
            );
        }
    }
}

#[tokio::test]
async fn handshakes_that_go_wrong_are_refused_or_time_out() {
    // The peer's READY names a socket type a SUB cannot talk to; a peer that sends ERROR.
    let (r, _) =
        with_peer(SocketType::Sub, opts(), |l| async move { Peer::accept(&l, 1, "ROUTER").await }).await;
    assert!(
        matches!(r, Err(ZmtpError::Protocol(ProtocolError::SocketType { ours: "SUB", .. }))),
        "{:?}",
        r.err()
    );
    let (r, _) = with_peer(SocketType::Dealer, opts(), |l| async move {
        let (mut tcp, _) = l.accept().await.unwrap();
        tcp.write_all(&codec::greeting()).await.unwrap();
        tcp.write_all(&codec::command("ERROR", b"\x0bnot allowed")).await.unwrap();
        tcp
    })
    .await;
    assert!(matches!(&r, Err(ZmtpError::Refused(why)) if why == "not allowed"), "{:?}", r.err());
    // A peer that accepts and says nothing, or stalls after half a greeting: the handshake's
    // timeout ends it.
    for sent in [0usize, 20] {
        let mut o = opts();
        o.timeout = Duration::from_millis(100);
        let (r, _) = with_peer(SocketType::Sub, o, |l| async move {
            let (mut tcp, _) = l.accept().await.unwrap();
            tcp.write_all(&codec::greeting()[..sent]).await.unwrap();
            tokio::time::sleep(Duration::from_secs(1)).await;
            tcp
        })
        .await;
        assert!(matches!(r, Err(ZmtpError::Timeout(Phase::Handshake, _))), "{sent}: {:?}", r.err());
    }
}

/// A peer that declares a frame at the cap, sends a little of it and stalls: heartbeats end the
/// connection; nothing near the declared size was held meanwhile (see zmtp_codec.rs for the
/// allocation itself).
#[tokio::test]
async fn a_peer_stalling_mid_frame_is_dropped_by_the_heartbeat() {
    let mut o = opts();
    (o.heartbeat, o.timeout) = (Some(Duration::from_millis(50)), Duration::from_millis(200));
    let header = [&[0x02][..], &((1u64 << 20) - 1).to_be_bytes(), &[0u8; 100]].concat();
    let e = hostile(true, header, o).await;
    assert!(matches!(e, ZmtpError::Timeout(Phase::Heartbeat, _)), "{e}");
}
