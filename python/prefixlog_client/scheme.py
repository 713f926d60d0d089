"""Canonical block hashes (must match engine/src/scheme.rs; checked against golden_vectors.json).

Scheme 1 (xxh3-64 chained): the prompt is cut into blocks of `block_size` token ids; block i's
hash is xxh3_64(u32 little-endian bytes of its tokens, seed = hash of block i-1), seed 0 for
block 0. A trailing partial block is not hashed (engines cache full blocks only).

Namespaces (e.g. a LoRA adapter's name): the chain starts from namespace_seed(namespace) =
xxh3_64(UTF-8 bytes of the namespace, seed NAMESPACE_SEED) instead of 0; "" is the plain scheme.

Extra keys (multimodal identifiers per block, vLLM's cache_salt): a block's hashed bytes are its
token bytes followed by its key set: the distinct keys sorted by their UTF-8 bytes, each as its
byte length (u32 little-endian) and its bytes. cache_salt is a key of block 0 only (it reaches
later blocks through the chaining). A block without keys hashes as in the plain scheme.
"""
import struct

import xxhash

SCHEME_XXH3_CHAINED = 1
NAMESPACE_SEED = int.from_bytes(b"prefixns", "big")


def namespace_seed(namespace):
    """The first block's seed under `namespace` (0 for the plain scheme)."""
    if not namespace:
        return 0
    return xxhash.xxh3_64_intdigest(namespace.encode("utf-8"), seed=NAMESPACE_SEED)


def _key_bytes(keys):
    out = b""
    for k in sorted(set(k.encode("utf-8") for k in keys)):
        out += struct.pack("<I", len(k)) + k
    return out


def block_hashes(tokens, block_size, namespace="", cache_salt="", extra=None):
    """Local hashes (ints in [0, 2**64)) of every full block of `tokens` under scheme 1, in
    `namespace` (e.g. the LoRA adapter the request runs under; "" for the base model), with
    vLLM's `cache_salt` ("" for none) and per-block keys `extra`: (block index, [identifier, ...])
    pairs, e.g. the multimodal identifiers of the inputs overlapping each block."""
    if block_size <= 0:
        return []
    n = len(tokens) // block_size
    keys = {}
    for b, ks in extra or ():
        if b < n:
            keys.setdefault(b, []).extend(ks)
    if cache_salt and n > 0:
        keys.setdefault(0, []).append(cache_salt)
    out = []
    seed = namespace_seed(namespace)
    fmt = "<%dI" % block_size
    for i in range(n):
        data = struct.pack(fmt, *tokens[i * block_size:(i + 1) * block_size]) + _key_bytes(keys.get(i, ()))
        seed = xxhash.xxh3_64_intdigest(data, seed=seed)
        out.append(seed)
    return out
