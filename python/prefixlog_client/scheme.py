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

Placed multimodal inputs and lookahead (vLLM >= 0.34): `mm_inputs` are (identifier, offset,
length) of each input's placeholder tokens in the prompt; every block whose hash window (the
block plus its `lookahead` tokens) the placeholder overlaps gets the key
0xFF 'm' + (offset - block start, i64 little-endian) + UTF-8 identifier. With `lookahead` L > 0
(vLLM's num_hash_lookahead_tokens), block i also gets the key 0xFF 'l' + the u32-LE tokens after
it, [(i+1)*bs, (i+1)*bs + L), and only blocks followed by L tokens are hashed. Keys starting with
0xFF cannot collide with text keys (no UTF-8 string contains that byte).
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
    """The key set's bytes; `keys` are str (text keys) or bytes (tagged keys, already encoded)."""
    out = b""
    for k in sorted(set(k.encode("utf-8") if isinstance(k, str) else k for k in keys)):
        out += struct.pack("<I", len(k)) + k
    return out


def mm_key(identifier, offset):
    """The tagged key of a multimodal input whose placeholder starts `offset` tokens after the
    block's first token (negative: before it)."""
    return b"\xffm" + struct.pack("<q", offset) + identifier.encode("utf-8")


def lookahead_key(tokens):
    """The tagged key of a block's lookahead tokens."""
    return b"\xffl" + struct.pack("<%dI" % len(tokens), *tokens)


def hashable_blocks(n_tokens, block_size, lookahead=0):
    """How many blocks of an `n_tokens` prompt are hashed: full blocks followed by `lookahead`
    more tokens."""
    if block_size <= 0:
        return 0
    return max(n_tokens - lookahead, 0) // block_size


def block_hashes(tokens, block_size, namespace="", cache_salt="", extra=None, mm_inputs=None, lookahead=0):
    """Local hashes (ints in [0, 2**64)) of every hashable block of `tokens` under scheme 1, in
    `namespace` (e.g. the LoRA adapter the request runs under; "" for the base model), with
    vLLM's `cache_salt` ("" for none), per-block keys `extra`: (block index, [identifier, ...])
    pairs, placed multimodal inputs `mm_inputs`: (identifier, offset, length) of each input's
    placeholder tokens, and vLLM's hash `lookahead` (tokens after each block its hash covers)."""
    n = hashable_blocks(len(tokens), block_size, lookahead)
    keys = {}
    for b, ks in extra or ():
        if b < n:
            keys.setdefault(b, []).extend(ks)
    if cache_salt and n > 0:
        keys.setdefault(0, []).append(cache_salt)
    for ident, offset, length in mm_inputs or ():
        if length <= 0:
            continue
        for b in range(n):
            start = b * block_size
            if offset < start + block_size + lookahead and offset + length > start:
                keys.setdefault(b, []).append(mm_key(ident, offset - start))
    out = []
    seed = namespace_seed(namespace)
    fmt = "<%dI" % block_size
    for i in range(n):
        end = (i + 1) * block_size
        ks = list(keys.get(i, ()))
        if lookahead > 0:
            ks.append(lookahead_key(tokens[end:end + lookahead]))
        data = struct.pack(fmt, *tokens[i * block_size:end]) + _key_bytes(ks)
        seed = xxhash.xxh3_64_intdigest(data, seed=seed)
        out.append(seed)
    return out
