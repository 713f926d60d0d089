"""Which log partition a worker's records live in (must match engine/src/types.rs partition_of).

Publishers key every record by its worker and place it with `partition_of`, so every replica,
publisher and client agrees on it; golden_vectors.json's "partition_of" list pins the Python
and the Rust function to the same values. A client uses it to pick the shard (`serve --shard`)
that answers for a worker, or to turn a worker's publish acknowledgement into a token.
"""

U64 = (1 << 64) - 1
PARTITION_SALT = 0x7072656669786C6F  # b"prefixlo", big-endian


def fmix64(x: int) -> int:
    """murmur3's 64-bit finaliser (engine/src/digest.rs mix64), on ints in [0, 2**64)."""
    x ^= x >> 33
    x = (x * 0xFF51AFD7ED558CCD) & U64
    x ^= x >> 33
    x = (x * 0xC4CEB9FE1A85EC53) & U64
    return x ^ (x >> 33)


def partition_of(worker: int, partitions: int) -> int:
    """The partition in [0, partitions) holding `worker`'s records; `partitions` 0 counts as 1,
    as in the Rust function (a u32 there). `worker` is a u64 worker id."""
    if not 0 <= worker <= U64:
        raise ValueError(f"worker id {worker} is not a u64")
    if not 0 <= partitions < 1 << 32:
        raise ValueError(f"partition count {partitions} is not a u32")
    return fmix64(worker ^ PARTITION_SALT) % max(partitions, 1)
