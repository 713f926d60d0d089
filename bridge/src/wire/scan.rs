//! Counting a payload's msgpack values before any is built.
//!
//! The general decoder builds an `rmpv::Value` (40 bytes) for every value, and an [`super::Event`]
//! (hundreds of bytes) for every element of the events array, however small its encoding: one
//! byte can be a value and one byte an event. A 16 MiB frame of empty arrays took 20 s and
//! 6 GiB to decode. [`within`] walks the encoding without allocating and says whether it holds
//! at most `max` values, so a payload past [`MAX_VALUES`] is refused before it is
//! decoded. Anything malformed or truncated is left to the decoder to refuse in its own words.

/// Nesting limit passed to rmpv (it counts about two per level).
pub const MAX_DEPTH: usize = 64;
/// Most msgpack values a payload may hold (every token id, hash and field is one): some ten
/// times a 64k-token step's. The general decoder builds 40 bytes per value however small its
/// encoding, so this bounds it to ~80 MiB per message.
pub const MAX_VALUES: usize = 1 << 21;
/// Most events a batch may hold (an event is hundreds of bytes decoded, one byte encoded).
pub const MAX_EVENTS: usize = 1 << 16;

/// Whether `payload`'s first msgpack value (and everything nested in it) counts at most `max`
/// values. `true` for a malformed or truncated payload: the decoder refuses it.
pub(super) fn within(payload: &[u8], max: usize) -> bool {
    let mut buf = payload;
    // Values still to read; each takes at least a byte, so more than the bytes left means a
    // truncated payload.
    let mut pending: u64 = 1;
    let mut seen: usize = 0;
    while pending > 0 {
        if pending > buf.len() as u64 {
            return true;
        }
        pending -= 1;
        seen += 1;
        if seen > max {
            return false;
        }
        let Some((children, skip)) = step(&mut buf) else { return true };
        pending += children;
        if skip > buf.len() as u64 {
            return true;
        }
        buf = &buf[skip as usize..];
    }
    true
}

/// Reads one value's marker and length fields from `buf`: the values nested in it and the
/// bytes of payload (string, binary, extension, number) to skip. `None` if malformed.
fn step(buf: &mut &[u8]) -> Option<(u64, u64)> {
    let (&m, rest) = buf.split_first()?;
    *buf = rest;
    let mut len = |n: usize| -> Option<u64> {
        let b = buf.get(..n)?;
        *buf = &buf[n..];
        Some(b.iter().fold(0u64, |acc, &x| acc << 8 | u64::from(x)))
    };
    Some(match m {
        0x00..=0x7f | 0xe0..=0xff | 0xc0 | 0xc2 | 0xc3 => (0, 0),
        0x80..=0x8f => (2 * u64::from(m & 0x0f), 0),
        0x90..=0x9f => (u64::from(m & 0x0f), 0),
        0xa0..=0xbf => (0, u64::from(m & 0x1f)),
        0xc4 | 0xd9 => (0, len(1)?),
        0xc5 | 0xda => (0, len(2)?),
        0xc6 | 0xdb => (0, len(4)?),
        0xc7 => (0, len(1)? + 1),
        0xc8 => (0, len(2)? + 1),
        0xc9 => (0, len(4)? + 1),
        0xca => (0, 4),
        0xcb => (0, 8),
        0xcc | 0xd0 => (0, 1),
        0xcd | 0xd1 => (0, 2),
        0xce | 0xd2 => (0, 4),
        0xcf | 0xd3 => (0, 8),
        0xd4 => (0, 2),
        0xd5 => (0, 3),
        0xd6 => (0, 5),
        0xd7 => (0, 9),
        0xd8 => (0, 17),
        0xdc => (len(2)?, 0),
        0xdd => (len(4)?, 0),
        0xde => (2 * len(2)?, 0),
        0xdf => (2 * len(4)?, 0),
        0xc1 => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::within;
    use rmpv::Value;

    fn encode(v: &Value) -> Vec<u8> {
        let mut out = Vec::new();
        rmpv::encode::write_value(&mut out, v).unwrap();
        out
    }

    /// The count is exact: a value with n values in all passes at n and fails at n - 1, for
    /// every kind of value and length field.
    #[test]
    fn counts_every_value_once() {
        let v = Value::Array(vec![
            Value::F64(1.5),
            Value::Array((0..300).map(|i| Value::from(i * 1_000_003)).collect()),
            Value::Map(vec![
                (Value::from("k".repeat(40)), Value::Binary(vec![7; 300])),
                (Value::from(-5), Value::Ext(3, vec![1, 2, 3, 4])),
                (Value::Nil, Value::Ext(1, vec![0; 70_000])),
            ]),
            Value::from(u64::MAX),
            Value::from(i64::MIN),
            Value::F32(2.0),
            Value::Boolean(true),
        ]);
        let n = 1 + 1 + 1 + 300 + 1 + 6 + 4;
        let p = encode(&v);
        assert!(within(&p, n));
        assert!(!within(&p, n - 1));
    }

    /// A declared length larger than the bytes left, a reserved marker, a cut payload: left to
    /// the decoder (true), never a panic.
    #[test]
    fn malformed_is_left_to_the_decoder() {
        assert!(within(&[0xdd, 0xff, 0xff, 0xff, 0xff, 0x90], 3));
        assert!(within(&[0x92, 0xc1, 0x90], 3));
        assert!(within(&[0xdb, 0, 0], 1));
        assert!(within(&[], 0));
        let p = encode(&Value::Array(vec![Value::from("abc"); 10]));
        for cut in 0..p.len() {
            let _ = within(&p[..cut], 4);
        }
    }
}
