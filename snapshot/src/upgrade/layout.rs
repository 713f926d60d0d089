//! The hand-laid little-endian layout of checkpoint formats 2 to 5: fixed-width integers,
//! `u32`-length strings, `u64`-length lists. Every read is bounds-checked, and a list's length is
//! checked against the bytes left before anything is allocated for it.

use crate::decode_error::DecodeError;
use prefixlog_engine::KeyspaceId;

#[derive(Default)]
pub struct Writer {
    pub buf: Vec<u8>,
}

impl Writer {
    pub fn u8(&mut self, v: u8) {
        self.buf.push(v);
    }
    pub fn u32(&mut self, v: u32) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub fn u64(&mut self, v: u64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub fn i64(&mut self, v: i64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub fn str(&mut self, s: &str) {
        self.u32(s.len() as u32);
        self.buf.extend_from_slice(s.as_bytes());
    }
    pub fn bytes(&mut self, b: &[u8]) {
        self.u64(b.len() as u64);
        self.buf.extend_from_slice(b);
    }
}

pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len());
        let end = end.ok_or(DecodeError::Truncated { at: self.pos, need: n })?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    pub fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }
    pub fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }
    pub fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }
    pub fn i64(&mut self) -> Result<i64, DecodeError> {
        Ok(i64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }
    pub fn str(&mut self) -> Result<String, DecodeError> {
        let n = self.u32()? as usize;
        String::from_utf8(self.take(n)?.to_vec()).map_err(|_| DecodeError::NotUtf8)
    }
    pub fn bytes(&mut self) -> Result<&'a [u8], DecodeError> {
        let n = self.u64()? as usize;
        self.take(n)
    }
    /// A length prefix, sanity-checked against the bytes left (each item needs ≥ `min` bytes).
    pub fn len(&mut self, min: usize) -> Result<usize, DecodeError> {
        let n = self.u64()? as usize;
        if n.saturating_mul(min.max(1)) > self.buf.len() - self.pos {
            return Err(DecodeError::LengthExceedsValue(n));
        }
        Ok(n)
    }
    pub fn done(&self) -> Result<(), DecodeError> {
        if self.pos == self.buf.len() {
            Ok(())
        } else {
            Err(DecodeError::TrailingBytes(self.buf.len() - self.pos))
        }
    }
}

pub fn put_keyspace_id(w: &mut Writer, id: &KeyspaceId) {
    w.str(&id.model);
    w.u32(id.block_size);
    w.u32(id.scheme);
}

pub fn get_keyspace_id(r: &mut Reader) -> Result<KeyspaceId, DecodeError> {
    Ok(KeyspaceId::new(r.str()?, r.u32()?, r.u32()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn corrupt_values_fail_with_what_is_wrong() {
        let mut r = Reader::new(&[1, 2, 3]);
        assert_eq!(r.u32(), Err(DecodeError::Truncated { at: 0, need: 4 }));
        assert_eq!(r.u8(), Ok(1));
        assert_eq!(r.done(), Err(DecodeError::TrailingBytes(2)));
        let mut w = Writer::default();
        w.u64(1_000);
        assert_eq!(Reader::new(&w.buf).len(1), Err(DecodeError::LengthExceedsValue(1_000)));
        let mut w = Writer::default();
        w.u32(2);
        w.buf.extend_from_slice(&[0xff, 0xfe]);
        assert_eq!(Reader::new(&w.buf).str(), Err(DecodeError::NotUtf8));
    }
}
