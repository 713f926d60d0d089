//! Damaged checkpoint values (format 6: postcard metas and partition values), seeded: a decode
//! is a typed error, never a panic or an abort, and no allocation it makes exceeds what the
//! bytes it was given could hold (a corrupt length that declares billions of items allocates
//! nothing for them). Checksums normally refuse such bytes first; these reach the decoder.

use prefixlog_snapshot::codec::{decode_partition_value, encode_partition_value, DecodeError};
use prefixlog_snapshot::{CheckpointMeta, KeyspaceEntry, StoreError, FORMAT_VERSION};
use prefixlog_state::record::encode_tick;
use prefixlog_state::{Applier, DigestPoint, LogIdentity, PartitionState, StateSettings};
use rand::{Rng, SeedableRng};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// The system allocator, noting the largest single allocation each thread asks for.
struct Largest;

thread_local! {
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

fn note(size: usize) {
    let _ = LARGEST.try_with(|l| l.set(l.get().max(size)));
}

// SAFETY: every call is passed on to `System` unchanged; only a thread-local is updated.
unsafe impl GlobalAlloc for Largest {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        unsafe { System.alloc(layout) }
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
static ALLOC: Largest = Largest;

/// The largest single allocation `f` makes on this thread, and its result.
fn largest_during<T>(f: impl FnOnce() -> T) -> (usize, T) {
    LARGEST.with(|l| l.set(0));
    let out = f();
    (LARGEST.with(Cell::get), out)
}

/// The most a decode of `len` bytes may allocate at once: one item of the largest stored type
/// per input byte (every item takes at least one byte).
fn bound(len: usize) -> usize {
    let item = size_of::<PartitionState>().max(size_of::<KeyspaceEntry>()).max(size_of::<Vec<DigestPoint>>());
    len.max(1) * item
}

fn applier() -> Applier {
    let mut a = Applier::new(4, StateSettings { digest_interval: 2, ..Default::default() });
    for i in 0..40u64 {
        let p = (i % 4) as u32;
        let w = prefixlog_state::record::worker_for_partition(p, 4);
        let off = a.partition(p).next_offset;
        a.apply(p, off, 1_000 + i, Some(&encode_tick(w))).unwrap();
    }
    a
}

fn identity() -> LogIdentity {
    LogIdentity {
        cluster_id: "c".into(),
        topic: "t".into(),
        partitions: 4,
        owned: vec![0, 1, 2, 3],
        settings: StateSettings::default(),
    }
}

/// `good` damaged the `i`th way: truncated, bytes overwritten, a huge length put in front,
/// or random bytes.
fn damage(good: &[u8], i: usize, rng: &mut impl Rng) -> Vec<u8> {
    let mut v = good.to_vec();
    match i % 4 {
        0 => v.truncate(rng.random_range(0..v.len())),
        1 => {
            for _ in 0..rng.random_range(1..6) {
                let j = rng.random_range(0..v.len());
                v[j] = rng.random();
            }
        }
        2 => {
            // A varint of up to 2^63 items, where a length belongs.
            let at = rng.random_range(0..v.len());
            let huge = [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f];
            v.splice(at..at, huge[..rng.random_range(3..=9)].iter().copied());
        }
        _ => v = (0..rng.random_range(0..300)).map(|_| rng.random()).collect(),
    }
    v
}

#[test]
fn damaged_partition_values_fail_typed_within_their_bytes() {
    let a = applier();
    let good = encode_partition_value(a.partitions(), &a.all_digest_points());
    assert!(decode_partition_value(&good, FORMAT_VERSION).is_ok());
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(47);
    let mut refused = 0;
    for i in 0..4_000 {
        let v = damage(&good, i, &mut rng);
        let (largest, out) = largest_during(|| decode_partition_value(&v, FORMAT_VERSION));
        assert!(largest <= bound(v.len()), "case {i}: {largest} bytes at once for a {}-byte value", v.len());
        if i % 4 == 0 {
            assert!(out.is_err(), "case {i}: a truncated value decodes");
        }
        refused += usize::from(out.is_err());
    }
    assert!(refused > 3_000, "damaged values are refused ({refused} of 4000)");
    // Billions of partitions declared in five bytes: refused, nothing allocated for them.
    let (largest, out) = largest_during(|| decode_partition_value(&[0xff, 0xff, 0xff, 0xff, 0x0f], 6));
    assert_eq!(out, Err(DecodeError::Malformed(postcard::Error::DeserializeUnexpectedEnd)));
    assert!(largest <= bound(5), "{largest}");
}

/// A meta with its checksum made right again, so the damage reaches the decoder.
fn resealed(mut v: Vec<u8>) -> Vec<u8> {
    let sum = xxhash_rust::xxh3::xxh3_64(&v);
    v.extend_from_slice(&sum.to_le_bytes());
    v
}

#[test]
fn damaged_metas_fail_typed_within_their_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let store = prefixlog_snapshot::CheckpointStore::open(dir.path()).unwrap();
    let meta = store.write(&identity(), &prefixlog_snapshot::Capture::of(&applier()), 0).unwrap();
    let stored = meta.encode();
    assert_eq!(CheckpointMeta::decode(meta.id, &stored).unwrap(), meta);
    let (format, body) = stored[..stored.len() - 8].split_at(4);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(4_747);
    let mut refused = 0;
    for i in 0..4_000 {
        let v = resealed([format, &damage(body, i, &mut rng)].concat());
        let (largest, out) = largest_during(|| CheckpointMeta::decode(meta.id, &v));
        assert!(largest <= bound(v.len()), "case {i}: {largest} bytes at once for a {}-byte meta", v.len());
        match out {
            Err(StoreError::Decode(_) | StoreError::Settings { .. } | StoreError::Damaged { .. }) => {
                refused += 1
            }
            Err(e) => panic!("case {i}: an untyped refusal: {e}"),
            Ok(_) => assert!(i % 4 != 0, "case {i}: a truncated meta decodes"),
        }
    }
    assert!(refused > 3_000, "damaged metas are refused ({refused} of 4000)");
}
