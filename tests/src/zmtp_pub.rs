//! A stand-in engine publisher in Rust: the binding side of a ZMTP 3.1 PUB socket (NULL
//! mechanism), for tests that need an engine stream without Python (the end-to-end bridge tests
//! use pyzmq's, and the upstream leg vLLM's own). It greets every connecting subscriber, answers
//! its READY with `Socket-Type PUB`, takes its subscription (the SUBSCRIBE command or the
//! `0x01 topic` message) and answers its heartbeats; [`StandInPub::send`] writes a message to
//! every subscriber whose subscription prefixes its first frame. Encoding and decoding are the
//! bridge's own (`prefixlog_bridge::zmtp::codec`): this checks the bridge against the protocol
//! as the bridge reads it, which is why interop is tested against libzmq elsewhere.

use prefixlog_bridge::zmtp::codec::{self, Decoder, Item, Limits};
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Mutex;

type Writer = Arc<Mutex<OwnedWriteHalf>>;
/// Each subscriber's subscription and its connection's writing half.
type Subscribers = Arc<Mutex<Vec<(Vec<u8>, Writer)>>>;

/// A bound PUB endpoint; dropped, it stops accepting (connections end with their tasks).
pub struct StandInPub {
    endpoint: String,
    subscribers: Subscribers,
    accept: tokio::task::JoinHandle<()>,
}

impl StandInPub {
    /// Binds a free loopback port.
    pub async fn bind() -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let endpoint = format!("tcp://{}", listener.local_addr()?);
        let subscribers: Subscribers = Arc::default();
        let accept = tokio::spawn({
            let subscribers = subscribers.clone();
            async move {
                while let Ok((tcp, _)) = listener.accept().await {
                    tokio::spawn(serve(tcp, subscribers.clone()));
                }
            }
        });
        Ok(Self { endpoint, subscribers, accept })
    }

    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Sends one message to every matching subscriber; returns how many it reached.
    pub async fn send(&self, frames: &[&[u8]]) -> usize {
        let bytes = codec::message(frames);
        let first = frames.first().copied().unwrap_or_default();
        let mut subs = self.subscribers.lock().await;
        let mut reached = 0;
        let mut alive = Vec::new();
        for (topic, w) in subs.drain(..) {
            if first.starts_with(&topic) {
                if w.lock().await.write_all(&bytes).await.is_err() {
                    continue;
                }
                reached += 1;
            }
            alive.push((topic, w));
        }
        *subs = alive;
        reached
    }
}

impl Drop for StandInPub {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// One subscriber's connection: handshake, then subscriptions and heartbeats.
async fn serve(tcp: TcpStream, subscribers: Subscribers) {
    let (mut r, w) = tcp.into_split();
    let w: Writer = Arc::new(Mutex::new(w));
    let mut greeting = [0u8; codec::GREETING_LEN];
    if w.lock().await.write_all(&codec::greeting()).await.is_err()
        || r.read_exact(&mut greeting).await.is_err()
        || codec::parse_greeting(&greeting).is_err()
        || w.lock().await.write_all(&codec::ready("PUB")).await.is_err()
    {
        return;
    }
    let mut decoder = Decoder::new(Limits::new(1 << 20));
    let mut buf = vec![0u8; 16 << 10];
    let mut ready = false;
    loop {
        let n = match r.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let mut input = &buf[..n];
        while !input.is_empty() {
            let topic = match decoder.decode(&mut input) {
                Err(_) => return,
                Ok(None) => continue,
                Ok(Some(Item::Command(c))) if c.is("READY") => {
                    ready = true;
                    continue;
                }
                Ok(Some(Item::Command(c))) if c.is("PING") => {
                    let pong = codec::pong_for(&c.data).unwrap_or_default();
                    if w.lock().await.write_all(&pong).await.is_err() {
                        return;
                    }
                    continue;
                }
                Ok(Some(Item::Command(c))) if c.is("SUBSCRIBE") => c.data.to_vec(),
                Ok(Some(Item::Message(m))) if m.len() == 1 && m[0].first() == Some(&1) => m[0][1..].to_vec(),
                Ok(Some(_)) => continue,
            };
            if ready {
                subscribers.lock().await.push((topic, w.clone()));
            }
        }
    }
}
