"""A release's randomness, keyed per record: the same seed gives the same draws however the table is split.

Why keyed per record
--------------------
A release drawn from one sequential stream gives record *i* the *i*-th draw of the stream, so its
noise depends on how many records came before it: split the table into partitions or workers and
the published values change. Here the draw for record *i* (its position in the source table) and
ε-quasi column *a* is a pure function of ``(seed, i, a)``, and so is the key that fixes the
published order. The in-memory path and the partitioned (Dask) path therefore publish the same
values in the same order for the same seed, and a rerun from the sealed seed is byte-identical on
either path.

How
---
Philox-4×64 (Salmon et al. 2011, numpy's ``Philox``) is a counter-based generator: block ``c`` of
its output is a keyed bijection of the counter ``c``. Each purpose — the noise of one column, the
release order — gets its own 128-bit Philox key, the first 16 bytes of
``SHA-256("kepsilon/record-streams/v1" ‖ purpose ‖ seed)``; record *i* uses the first 64-bit word of
block *i*. A uniform in the open interval (0, 1) is made from its top 53 bits,
``u = (⌊w / 2¹¹⌋ + ½) / 2⁵³``, and a standard Laplace draw from ``u`` by the inverse CDF
(``ln 2u`` below ½, ``−ln 2(1 − u)`` above), with no rejection step that could shift later draws.
The release order sorts the records by their keyed word (ties, probability about n²/2⁶⁵, broken by
position), which is a uniformly random permutation up to those ties.

What it is not: Philox is not a cryptographic generator, and its keys are derived from the seed, so
the seed (sealed in the audit store) is what must stay secret; nothing here logs or prints it or
the keys (``repr`` shows neither).
"""

import hashlib

import numpy as np

from .errors import SpecError
from .sorting import key_then_position_order, stable_argsort

SEED_BYTES = 32
STREAMS_VERSION = "record-streams/v1"  # recorded in the private report: a change of scheme changes every value
_DOMAIN = b"kepsilon/record-streams/v1"
_WORDS_PER_BLOCK = 4
_SPAN = 1 << 20  # blocks generated at once (32 MiB)


class RecordStreams:
    """The keyed per-record draws of one release: Laplace noise per column, and the release order."""

    __slots__ = ("_noise_secret", "_order_key")

    def __init__(self, seed: bytes):
        if not isinstance(seed, (bytes, bytearray)) or len(seed) != SEED_BYTES:
            raise SpecError("seed", f"must be exactly {SEED_BYTES} bytes")
        # Kept as a derived secret, not the seed: column keys are hashed from it on demand.
        self._noise_secret = hashlib.sha256(_DOMAIN + b"/noise\0" + bytes(seed)).digest()
        self._order_key = _philox_key(_DOMAIN + b"/order\0" + bytes(seed))

    def __repr__(self) -> str:
        return "RecordStreams(<keyed; seed withheld>)"

    def laplace(self, column: str, positions) -> np.ndarray:
        """Standard Laplace draws (scale 1) for the records at ``positions`` on ``column``."""
        key = _philox_key(self._noise_secret + b"\0" + column.encode("utf-8"))
        return standard_laplace(_open_uniforms(_keyed_words(key, positions)))

    def order_keys(self, positions) -> np.ndarray:
        """The 64-bit sort key of each record's place in the published order."""
        return _keyed_words(self._order_key, positions)

    def order(self, positions) -> np.ndarray:
        """The published order of the records at ``positions``: a permutation of ``range(len(positions))``.

        ``order[j]`` is the row (of the given ones) published j-th; it sorts by the keyed word, then
        by position, so any subset of records keeps the relative order it has in the whole table.
        """
        positions = _checked_positions(positions)
        return key_then_position_order(self.order_keys(positions), positions)


def _philox_key(material: bytes) -> int:
    return int.from_bytes(hashlib.sha256(material).digest()[:16], "little")


def _checked_positions(positions) -> np.ndarray:
    positions = np.asarray(positions)
    if positions.ndim != 1 or (positions.size and not np.issubdtype(positions.dtype, np.integer)):
        raise SpecError("positions", "must be a one-dimensional array of integer record positions")
    positions = positions.astype(np.int64, copy=False)
    if positions.size and positions.min() < 0:
        raise SpecError("positions", "must be non-negative record positions")
    return positions


def _keyed_words(key: int, positions) -> np.ndarray:
    """The first 64-bit word of Philox block ``p`` under ``key``, for each position ``p``.

    Positions close together (the whole table, a piece of it) are generated a run at a time: one
    generator covers the span from a run's smallest to its largest position, in runs of at most
    ``_SPAN`` blocks so memory stays flat on any table. Positions spread thin over a wider span (a
    class partition holds records from every piece of the source) are computed block by block
    (:func:`_philox_first_words`), so the cost follows the records, not the table they are spread over.
    """
    positions = _checked_positions(positions)
    if positions.size and int(positions.max()) - int(positions.min()) >= _SPARSE * positions.size:
        return _philox_first_words(key, positions)
    words = np.empty(positions.size, dtype=np.uint64)
    by_position = stable_argsort(positions)
    ordered = positions[by_position]
    first = 0
    while first < ordered.size:
        start = int(ordered[first])
        last = int(np.searchsorted(ordered, start + _SPAN, side="left"))
        span = int(ordered[last - 1]) - start + 1
        blocks = np.random.Philox(key=key, counter=start).random_raw(span * _WORDS_PER_BLOCK)
        words[by_position[first:last]] = blocks.reshape(span, _WORDS_PER_BLOCK)[ordered[first:last] - start, 0]
        first = last
    return words


# Philox-4×64-10's constants (Salmon et al. 2011; numpy's philox.h): the round multipliers and the key bumps.
_PHILOX_M = (np.uint64(0xD2E7470EE14C6C93), np.uint64(0xCA5A826395121157))
_PHILOX_W = (0x9E3779B97F4A7C15, 0xBB67AE8584CAA73B)
_PHILOX_ROUNDS = 10
_LOW32 = np.uint64(0xFFFFFFFF)
_MASK64 = 0xFFFFFFFFFFFFFFFF
_CHUNK = 1 << 14  # positions computed at once: the round's arrays stay in the processor's cache
_SPARSE = 2  # positions spanning at least this many blocks each are computed block by block


def _philox_first_words(key: int, positions: np.ndarray) -> np.ndarray:
    """:func:`_keyed_words` for any positions, each block computed from its counter alone: the
    first word of ``numpy.random.Philox(key=key, counter=0).random_raw()``'s block ``p`` (numpy counts
    its first block as counter 1), the same words as the runs' generators give."""
    words = np.empty(positions.size, dtype=np.uint64)
    for start in range(0, positions.size, _CHUNK):
        chosen = positions[start:start + _CHUNK].astype(np.uint64) + np.uint64(1)
        words[start:start + _CHUNK] = _philox_block_word(key, chosen)
    return words


def _philox_block_word(key: int, counters: np.ndarray) -> np.ndarray:
    """The first word of Philox-4×64-10's block at each 64-bit counter (the counter's upper words 0).

    The upper words being 0, the first two rounds hold words that are the same for every counter: the first
    round's second product is 0 (so its first word out is the key's low word), and the second round's first
    product is that word's, computed once in Python's integers. Two of the twenty array products are saved;
    the words are those of the plain rounds (the test against numpy's Philox).
    """
    low_key, high_key = key & _MASK64, key >> 64
    c3: np.ndarray | np.uint64  # the same for every counter after round 2
    with np.errstate(over="ignore"):  # products modulo 2⁶⁴ are the point
        high0, low0 = _multiply_high_low(counters, _PHILOX_M[0])  # round 1; c1 = c2 = c3 = 0
        same_c0, c2, c3 = low_key, high0 ^ np.uint64(high_key), low0
        low_key, high_key = (low_key + _PHILOX_W[0]) & _MASK64, (high_key + _PHILOX_W[1]) & _MASK64
        product = same_c0 * int(_PHILOX_M[0])  # round 2; c1 = 0
        high1, low1 = _multiply_high_low(c2, _PHILOX_M[1])
        c0, c1 = high1 ^ np.uint64(low_key), low1
        c2, c3 = c3 ^ np.uint64((product >> 64) ^ high_key), np.uint64(product & _MASK64)
        low_key, high_key = (low_key + _PHILOX_W[0]) & _MASK64, (high_key + _PHILOX_W[1]) & _MASK64
        for _ in range(_PHILOX_ROUNDS - 2):
            high0, low0 = _multiply_high_low(c0, _PHILOX_M[0])
            high1, low1 = _multiply_high_low(c2, _PHILOX_M[1])
            c0, c1, c2, c3 = high1 ^ c1 ^ np.uint64(low_key), low1, high0 ^ c3 ^ np.uint64(high_key), low0
            low_key = (low_key + _PHILOX_W[0]) & _MASK64
            high_key = (high_key + _PHILOX_W[1]) & _MASK64
    return c0


def _multiply_high_low(values: np.ndarray, factor: np.uint64) -> tuple[np.ndarray, np.ndarray]:
    """The high and low 64-bit words of each ``value × factor`` (128 bits), from 32-bit halves.

    With ``v = vh·2³² + vl`` and ``f = fh·2³² + fl``: ``t = vl·fh + ⌊vl·fl / 2³²⌋`` and
    ``u = vh·fl + (t mod 2³²)`` stay below 2⁶⁴, and the high word is ``vh·fh + ⌊t / 2³²⌋ + ⌊u / 2³²⌋``:
    15 array operations where summing the four partial products' halves took 18, added in place
    (130 against 176 µs on 16,384 values here).
    """
    factor_low, factor_high = factor & _LOW32, factor >> np.uint64(32)
    value_low, value_high = values & _LOW32, values >> np.uint64(32)
    carried = value_low * factor_high
    carried += (value_low * factor_low) >> np.uint64(32)
    middle = value_high * factor_low
    middle += carried & _LOW32
    high = value_high * factor_high
    high += carried >> np.uint64(32)
    high += middle >> np.uint64(32)
    return high, values * factor


def _open_uniforms(words: np.ndarray) -> np.ndarray:
    """Uniforms in the open interval (0, 1) from the top 53 bits of each word (never 0, never 1)."""
    return ((words >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0**-53


def standard_laplace(uniforms: np.ndarray) -> np.ndarray:
    """Laplace(0, 1) by the inverse CDF of uniforms in (0, 1)."""
    lower = uniforms < 0.5
    out = np.empty_like(uniforms)
    out[lower] = np.log(2.0 * uniforms[lower])
    out[~lower] = -np.log(2.0 * (1.0 - uniforms[~lower]))
    return out
