//! The bridge's ZMTP framing (`prefixlog_bridge::zmtp::codec`) against the specifications
//! (rfc.zeromq.org 23/ZMTP and 37/ZMTP): greetings, the NULL handshake's bytes (RFC 37's worked
//! example), short and long frames, MORE, commands, READY metadata, every cap, truncated input,
//! and a seeded property test over arbitrary bytes: never a panic, and never an allocation past
//! the caps. Allocations are recorded by this binary's global allocator, per thread, while a test
//! decodes (`PREFIXLOG_BRIDGE_FUZZ_SEEDS=N` runs more seeds).

use bytes::Bytes;
use prefixlog_bridge::zmtp::codec::{
    self, DecodeError, Decoder, Item, Limits, Oversized, ProtocolError, Version,
};
use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// The system allocator, recording the largest single allocation of a thread while asked.
struct Recording;

thread_local! {
    static RECORDING: Cell<bool> = const { Cell::new(false) };
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

fn note(size: usize) {
    let _ = RECORDING.try_with(|on| {
        if on.get() {
            let _ = LARGEST.try_with(|l| l.set(l.get().max(size)));
        }
    });
}

unsafe impl GlobalAlloc for Recording {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Recording = Recording;

/// Runs `f`, returning its result and the largest allocation it made on this thread.
fn largest_allocation<T>(f: impl FnOnce() -> T) -> (T, usize) {
    LARGEST.with(|l| l.set(0));
    RECORDING.with(|r| r.set(true));
    let out = f();
    RECORDING.with(|r| r.set(false));
    (out, LARGEST.with(Cell::get))
}

const SMALL: Limits = Limits { max_frame: 1000, max_message: 2500, max_frames: 4, max_command: 300 };

/// Feeds `input` whole; every item, then the error if one ends it.
fn decode_all(limits: Limits, input: &[u8]) -> (Vec<Item>, Option<DecodeError>) {
    decode_chunked(limits, input, &[input.len().max(1)])
}

/// Feeds `input` in chunks of the given sizes (cycled).
fn decode_chunked(limits: Limits, input: &[u8], chunks: &[usize]) -> (Vec<Item>, Option<DecodeError>) {
    let mut d = Decoder::new(limits);
    let mut items = Vec::new();
    let mut rest = input;
    for &n in chunks.iter().cycle() {
        if rest.is_empty() {
            return (items, None);
        }
        let (mut chunk, after) = rest.split_at(n.max(1).min(rest.len()));
        rest = after;
        while !chunk.is_empty() {
            match d.decode(&mut chunk) {
                Ok(Some(item)) => items.push(item),
                Ok(None) => assert!(chunk.is_empty(), "None leaves nothing unread"),
                Err(e) => return (items, Some(e)),
            }
            assert!(d.held() <= limits.max_message + limits.max_command, "held {}", d.held());
        }
    }
    unreachable!("cycle ends when the input does")
}

fn b(x: &[u8]) -> Bytes {
    Bytes::copy_from_slice(x)
}

fn oversized(e: Option<DecodeError>) -> Oversized {
    match e {
        Some(DecodeError::Oversized(o)) => o,
        other => panic!("expected an oversized error, got {other:?}"),
    }
}

#[test]
fn greetings_are_checked_field_by_field() {
    let ours = codec::greeting();
    assert_eq!(&ours[..12], &[0xFF, 0, 0, 0, 0, 0, 0, 0, 0, 0x7F, 3, 1]);
    assert_eq!(&ours[12..16], b"NULL");
    assert!(ours[16..].iter().all(|&x| x == 0), "mechanism padding, as-server 0, filler");
    assert_eq!(codec::parse_greeting(&ours), Ok(Version { major: 3, minor: 1 }));
    let with = |i: usize, v: &[u8]| {
        let mut g = ours;
        g[i..i + v.len()].copy_from_slice(v);
        g
    };
    // Padding is not significant; later versions are accepted; 3.0 has no commands.
    assert!(codec::parse_greeting(&with(1, &[7; 8])).is_ok());
    assert_eq!(codec::parse_greeting(&with(10, &[4, 0])), Ok(Version { major: 4, minor: 0 }));
    assert!(!codec::parse_greeting(&with(11, &[0])).unwrap().has_commands());
    assert!(Version { major: 3, minor: 1 }.has_commands());
    assert!(matches!(codec::parse_greeting(&with(0, b"G")), Err(ProtocolError::Signature(_))));
    assert!(matches!(codec::parse_greeting(&with(9, &[0x7E])), Err(ProtocolError::Signature(_))));
    assert_eq!(codec::parse_greeting(&with(10, &[2])), Err(ProtocolError::Version(2)));
    assert_eq!(codec::parse_greeting(&with(12, b"PLAIN")), Err(ProtocolError::Mechanism("PLAIN".into())));
    assert_eq!(codec::parse_greeting(&with(16, b"X")), Err(ProtocolError::Mechanism("NULLX".into())));
    // A non-zero octet after the name's end is not NULL either.
    assert!(matches!(codec::parse_greeting(&with(20, b"X")), Err(ProtocolError::Mechanism(_))));
    // The head alone tells an HTTP client or a ZMTP 2.0 peer apart.
    assert!(matches!(codec::check_greeting_head(b"GET / HTTP/1.1"), Err(ProtocolError::Signature(_))));
    assert!(matches!(codec::check_greeting_head(&ours[..5]), Err(ProtocolError::Signature(_))));
    assert_eq!(codec::check_greeting_head(&with(10, &[1])[..11]), Err(ProtocolError::Version(1)));
}

/// RFC 37, "Worked Example": a DEALER's READY, byte for byte, and a ROUTER's read back.
#[test]
fn the_null_handshake_matches_the_worked_example() {
    let mut want = vec![0x04, 41, 5];
    want.extend_from_slice(b"READY");
    want.push(11);
    want.extend_from_slice(b"Socket-Type");
    want.extend_from_slice(&[0, 0, 0, 6]);
    want.extend_from_slice(b"DEALER");
    want.push(8);
    want.extend_from_slice(b"Identity");
    want.extend_from_slice(&[0, 0, 0, 0]);
    assert_eq!(codec::ready("DEALER"), want);
    // A SUB announces no identity.
    assert_eq!(codec::ready("SUB").len(), 2 + 6 + 12 + 4 + 3);
    let (items, err) = decode_all(Limits::new(100), &codec::ready("ROUTER"));
    assert_eq!(err, None);
    let [Item::Command(c)] = &items[..] else { panic!("{items:?}") };
    assert!(c.is("READY"));
    assert_eq!(codec::property(&c.data, "socket-type"), Ok(Some(&b"ROUTER"[..])));
    assert_eq!(codec::property(&c.data, "Identity"), Ok(Some(&b""[..])));
    assert_eq!(codec::property(&c.data, "Resource"), Ok(None));
}

#[test]
fn metadata_that_does_not_parse_is_refused() {
    let good = codec::metadata(&[("Socket-Type", b"PUB"), ("X-Any", b"value")]);
    assert_eq!(codec::property(&good, "x-any"), Ok(Some(&b"value"[..])));
    assert_eq!(codec::property(&good[..good.len() - 1], "Socket-Type"), Err(ProtocolError::Metadata));
    assert_eq!(codec::property(&[0, 0, 0, 0, 0], "a"), Err(ProtocolError::Metadata), "an empty name");
    assert_eq!(codec::property(&[1, b'a', 0x80, 0, 0, 0], "a"), Err(ProtocolError::Metadata), "over 2^31-1");
    assert_eq!(codec::property(&[1, b'a', 0, 0], "a"), Err(ProtocolError::Metadata), "a short size");
    assert_eq!(codec::property(&[], "a"), Ok(None));
}

#[test]
fn short_and_long_frames_messages_and_commands() {
    // Short (255) and long (256) sizes, the first MORE, an empty last frame.
    let (short, long) = (vec![7u8; 255], vec![8u8; 256]);
    let m = codec::message(&[&short, &long, b""]);
    assert_eq!(&m[..2], &[0x01, 255]);
    assert_eq!(&m[257..266], &[0x03, 0, 0, 0, 0, 0, 0, 1, 0]);
    assert_eq!(&m[m.len() - 2..], &[0x00, 0]);
    let ping = codec::ping(0, b"ctx");
    assert_eq!(ping, [&[0x04, 10, 4][..], b"PING", &[0, 0], b"ctx"].concat());
    let mut stream = m.clone();
    stream.extend_from_slice(&ping);
    stream.extend_from_slice(&codec::message(&[b"one"]));
    let (items, err) = decode_all(Limits::new(1000), &stream);
    assert_eq!(err, None);
    let Item::Command(c) = &items[1] else { panic!("{items:?}") };
    assert_eq!((c.is("PING"), c.data.as_ref()), (true, &[0, 0, b'c', b't', b'x'][..]));
    assert_eq!(codec::pong_for(&c.data).unwrap(), [&[0x04, 8, 4][..], b"PONG", b"ctx"].concat());
    assert_eq!(codec::pong_for(&[0]), None, "a PING without its TTL");
    assert_eq!(
        (&items[0], &items[2]),
        (&Item::Message(vec![b(&short), b(&long), Bytes::new()]), &Item::Message(vec![b(b"one")]))
    );
    // A long-form size for a short body is allowed; so is a command between a message's frames.
    let mut odd = vec![0x03, 0, 0, 0, 0, 0, 0, 0, 2, b'h', b'i'];
    odd.extend_from_slice(&codec::command("PONG", b""));
    odd.extend_from_slice(&[0x00, 1, b'!']);
    let (items, err) = decode_all(Limits::new(10), &odd);
    assert_eq!(err, None);
    assert!(matches!(&items[0], Item::Command(c) if c.is("PONG")));
    assert_eq!(items[1], Item::Message(vec![b(b"hi"), b(b"!")]));
}

#[test]
fn subscriptions_follow_the_peer_version() {
    let v31 = Version { major: 3, minor: 1 };
    let v30 = Version { major: 3, minor: 0 };
    assert_eq!(codec::subscription(b"kv", v31), [&[0x04, 12, 9][..], b"SUBSCRIBE", b"kv"].concat());
    assert_eq!(codec::subscription(b"kv", v30), vec![0x00, 3, 1, b'k', b'v']);
    assert_eq!(codec::subscription(b"", v30), vec![0x00, 1, 1]);
}

#[test]
fn frames_the_grammar_does_not_allow_are_refused() {
    for flags in [0x08, 0x80, 0x05, 0x07] {
        let (_, err) = decode_all(SMALL, &[flags, 0]);
        assert_eq!(err, Some(ProtocolError::Flags(flags).into()), "{flags:#x}");
    }
    for body in [&[0x04, 0][..], &[0x04, 1, 0], &[0x04, 3, 5, b'A', b'B']] {
        let (_, err) = decode_all(SMALL, body);
        assert_eq!(err, Some(ProtocolError::Command.into()), "{body:?}");
    }
    // After an error, only errors.
    let mut d = Decoder::new(SMALL);
    let mut input: &[u8] = &[0xFF, 0, 0x00, 0];
    assert!(d.decode(&mut input).is_err());
    assert_eq!(d.decode(&mut &[0x00, 0][..]), Err(ProtocolError::Failed.into()));
}

#[test]
fn every_cap_is_checked_before_anything_is_reserved() {
    // The drill's header: a long frame declaring 2^62 octets. Nothing is allocated for it.
    let header = [0x02, 0x40, 0, 0, 0, 0, 0, 0, 0];
    let ((_, err), largest) = largest_allocation(|| decode_all(Limits::new(64 << 20), &header));
    let o = oversized(err);
    assert_eq!((o.what, o.declared, o.cap), ("frame bytes", 1 << 62, 64 << 20));
    assert!(largest < 1024, "allocated {largest} bytes for a 2^62-byte header");
    // Exactly at each cap passes; one more fails.
    let at = |n: usize| codec::message(&[&vec![0u8; n]]);
    assert_eq!(decode_all(SMALL, &at(1000)).1, None);
    assert_eq!(oversized(decode_all(SMALL, &at(1001)).1).what, "frame bytes");
    let cmd = |n: usize| codec::command("X", &vec![0u8; n - 2]);
    assert_eq!(decode_all(SMALL, &cmd(300)).1, None);
    let o = oversized(decode_all(SMALL, &cmd(301)).1);
    assert!(!o.is_message() && o.what == "command bytes", "{o}");
    let (a, c) = (vec![0u8; 1000], vec![0u8; 500]);
    assert_eq!(decode_all(SMALL, &codec::message(&[&a, &a, &c])).1, None);
    let o = oversized(decode_all(SMALL, &codec::message(&[&a, &a, &c, b"x"])).1);
    assert_eq!((o.what, o.declared, o.cap), ("message bytes", 2501, 2500));
    assert_eq!(decode_all(SMALL, &codec::message(&[b"", b"", b"", b""])).1, None);
    let o = oversized(decode_all(SMALL, &codec::message(&[b"", b"", b"", b"", b""])).1);
    assert_eq!((o.what, o.declared, o.cap), ("frames in a message", 5, 4));
    // A command whose long size is 2^63 - 1; endless empty MORE frames.
    let huge_command = [0x06, 0x7F, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF];
    assert_eq!(oversized(decode_all(SMALL, &huge_command).1).declared, u64::MAX >> 1);
    let endless = [0x01u8, 0].repeat(100_000);
    let ((_, err), largest) = largest_allocation(|| decode_all(Limits::new(64 << 20), &endless));
    assert_eq!(oversized(err).what, "frames in a message");
    assert!(largest <= 64 * std::mem::size_of::<Bytes>(), "{largest}");
}

/// A body grows with what arrives, never past its declared size: a peer that declares the cap
/// and stalls holds what it sent (doubling from 4 KiB), not the cap.
#[test]
fn a_stalled_frame_holds_what_arrived() {
    let mut d = Decoder::new(Limits::new(64 << 20));
    let mut header: &[u8] = &[0x02, 0, 0, 0, 0, 0x04, 0, 0, 0];
    assert_eq!(d.decode(&mut header), Ok(None));
    let (r, largest) = largest_allocation(|| d.decode(&mut &[1u8; 10_000][..]));
    assert_eq!(r, Ok(None));
    assert!(largest <= 16 << 10 && d.held() <= 16 << 10, "{largest} {}", d.held());
    // The rest completes it, at exactly its size.
    let rest = vec![2u8; (64 << 20) - 10_000];
    let (r, largest) = largest_allocation(|| d.decode(&mut &rest[..]));
    let Ok(Some(Item::Message(frames))) = r else { panic!("{r:?}") };
    assert_eq!(frames[0].len(), 64 << 20);
    assert!(largest <= 64 << 20, "{largest}");
}

#[test]
fn truncated_input_waits_and_chunking_never_matters() {
    let mut stream = codec::message(&[b"topic", &7u64.to_be_bytes(), &vec![3u8; 700]]);
    stream.extend_from_slice(&codec::ping(5, b""));
    stream.extend_from_slice(&codec::message(&[&vec![9u8; 300]]));
    let (whole, err) = decode_all(Limits::new(1000), &stream);
    assert_eq!((whole.len(), err), (3, None));
    for chunks in [&[1][..], &[2, 7], &[9], &[300, 1, 1]] {
        assert_eq!(decode_chunked(Limits::new(1000), &stream, chunks), (whole.clone(), None), "{chunks:?}");
    }
    // Cut anywhere: what is complete comes out, the rest waits (no error, nothing invented).
    for cut in 0..stream.len() {
        let (items, err) = decode_all(Limits::new(1000), &stream[..cut]);
        assert_eq!(err, None, "cut at {cut}");
        assert_eq!(items[..], whole[..items.len()], "cut at {cut}");
    }
}

/// Arbitrary bytes, frame-shaped noise and mutated valid streams, fed in random chunks: no
/// panic, no allocation past the caps, and the same outcome however the input is chunked.
#[test]
fn arbitrary_input_never_panics_nor_allocates_past_the_caps() {
    let seeds: u64 =
        std::env::var("PREFIXLOG_BRIDGE_FUZZ_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(3_000);
    let bound = SMALL.max_frame.max(SMALL.max_command).max(64 * std::mem::size_of::<Bytes>());
    let valid = [
        codec::message(&[b"kv", &1u64.to_be_bytes(), &[5u8; 900]]),
        codec::command("READY", &codec::metadata(&[("Socket-Type", b"PUB")])),
        codec::ping(10, b"0123456789abcdef"),
        codec::message(&[b"", b"", &[1u8; 400]]),
    ];
    let (mut items, mut errors) = (0usize, 0usize);
    for seed in 0..seeds {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let input: Vec<u8> = match seed % 3 {
            0 => {
                let mut v = vec![0u8; rng.random_range(0..2_000)];
                rng.fill_bytes(&mut v);
                v
            }
            // Plausible headers (low flag bits, small or huge sizes) with bodies of noise.
            1 => (0..rng.random_range(1..12)).flat_map(|_| noise_frame(&mut rng)).collect(),
            _ => {
                let mut v: Vec<u8> =
                    (0..3).flat_map(|_| valid[rng.random_range(0..valid.len())].clone()).collect();
                for _ in 0..rng.random_range(1..4) {
                    let i = rng.random_range(0..v.len());
                    v[i] = rng.random();
                }
                v
            }
        };
        let chunks: Vec<usize> = (0..4).map(|_| rng.random_range(1..600)).collect();
        let (out, largest) = largest_allocation(|| decode_chunked(SMALL, &input, &chunks));
        assert!(largest <= bound, "seed {seed}: allocated {largest} > {bound}");
        assert_eq!(out, decode_all(SMALL, &input), "seed {seed}: chunking changed the outcome");
        items += out.0.len();
        errors += usize::from(out.1.is_some());
    }
    assert!(items > seeds as usize / 3 && errors > seeds as usize / 3, "{items} items, {errors} errors");
}

fn noise_frame(rng: &mut ChaCha8Rng) -> Vec<u8> {
    let flags = rng.random_range(0..8u8);
    let size: u64 = if rng.random_bool(0.2) { rng.random() } else { rng.random_range(0..400) };
    let mut out = vec![flags];
    if flags & 2 != 0 {
        out.extend_from_slice(&size.to_be_bytes());
    } else {
        out.push(size as u8);
    }
    let body = (size as usize).min(400);
    out.extend((0..body).map(|_| rng.random::<u8>()));
    out
}
