"""The count-sketch hash of docs/statistics.md (C++: agent/src/stats/sketch_hash.h) in
int64 torch ops, on any device: which bucket and sign each element of a tensor goes to.
Every int64 product stays below 2^63, so the results are those of the C++ host kernel and
the Triton kernel, bit for bit (tests/stats/torch_stats_test.py has known answers)."""
import threading

import torch

_M32 = 0xFFFFFFFF
_MIX = 0x045D9F3B
SIGN_SEED = 0x2545F491
ROT_SEED = 0x1B873593
PAT_SEED = 0x6A09E667
NUM_PATTERNS = 256
PATTERN_BITS = 256


def mix32(v):
    """Mix32 of an int64 tensor holding values in [0, 2^32)."""
    v = ((v ^ (v >> 16)) * _MIX) & _M32
    v = ((v ^ (v >> 16)) * _MIX) & _M32
    return v ^ (v >> 16)


def hash_index(i, seed):
    return mix32((i & _M32) ^ seed ^ mix32(i >> 32))


_pattern_cache = {}
_cache_lock = threading.Lock()


def patterns(device):
    """[256, 256] bool: bit o of sign pattern p."""
    with _cache_lock:
        t = _pattern_cache.get(device)
    if t is None:
        idx = torch.arange(NUM_PATTERNS * PATTERN_BITS, dtype=torch.int64, device=device)
        t = (hash_index(idx, SIGN_SEED) >> 31).bool().view(NUM_PATTERNS, PATTERN_BITS)
        with _cache_lock:
            _pattern_cache[device] = t
    return t


def block_hash(numel, k, device, start=0):
    """Per-block rotation r(b) of all blocks, and the sign bit of elements
    [start, start + numel) (start a multiple of k)."""
    nblocks = (numel + k - 1) // k
    b = torch.arange(start // k, start // k + nblocks, dtype=torch.int64, device=device)
    h1 = hash_index(b, ROT_SEED)
    rot = (h1 * k) >> 32
    h2 = mix32(h1 ^ PAT_SEED)
    pat = h2 >> 24
    flip = ((h2 >> 23) & 1).bool()
    i = torch.arange(numel, dtype=torch.int64, device=device)
    blk = torch.div(i, k, rounding_mode="floor")
    o = i - blk * k
    neg = patterns(device)[pat[blk], o] ^ flip[blk]
    return rot, neg, blk, o


def sketch_index(numel, k, device):
    """(bucket int64 [numel], negative bool [numel]) for the flat indices 0..numel-1."""
    rot, neg, blk, o = block_hash(numel, k, device)
    return (o + rot[blk]) % k, neg


def block_codes(first_block, nblocks, k, device):
    """int64 [2, nblocks]: the rotation r(b) and the sign-pattern row 2 p(b) + flip(b)
    of blocks first_block .. first_block + nblocks (docs/statistics.md, bit for bit)."""
    b = torch.arange(first_block, first_block + nblocks, dtype=torch.int64, device=device)
    h1 = hash_index(b, ROT_SEED)
    rot = (h1 * k) >> 32
    h2 = mix32(h1 ^ PAT_SEED)
    return torch.stack([rot, ((h2 >> 24) << 1) | ((h2 >> 23) & 1)])
