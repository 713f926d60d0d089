"""Canonical block hashes (must match engine/src/scheme.rs; checked against golden_vectors.json).

Scheme 1 (xxh3-64 chained): the prompt is cut into blocks of `block_size` token ids; block i's
hash is xxh3_64(u32 little-endian bytes of its tokens, seed = hash of block i-1), seed 0 for
block 0. A trailing partial block is not hashed (engines cache full blocks only).
"""
import struct

import xxhash

SCHEME_XXH3_CHAINED = 1


def block_hashes(tokens, block_size):
    """Local hashes (ints in [0, 2**64)) of every full block of `tokens` under scheme 1."""
    if block_size <= 0:
        return []
    out = []
    seed = 0
    fmt = "<%dI" % block_size
    for i in range(len(tokens) // block_size):
        seed = xxhash.xxh3_64_intdigest(struct.pack(fmt, *tokens[i * block_size:(i + 1) * block_size]), seed=seed)
        out.append(seed)
    return out
