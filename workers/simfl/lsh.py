"""p-stable locality-sensitive hashing and the most similar row (SimFL, Li, Wen, He, AAAI 2020,
section "Preprocessing", Algorithm 1; the hash family is Datar et al., SoCG 2004).

A function ``F_{a,b}(v) = floor((a . v + b) / r)`` with ``a ~ N(0, I_d)`` (the Gaussian is
2-stable, so ``a . u - a . v ~ N(0, |u - v|^2)``) and ``b ~ U[0, r)`` puts close rows into the
same window with high probability. With L such functions, the row of another member that
shares the most values with a row is taken as its most similar row (Algorithm 1, line 11).

In a job the aggregator receives no hash value but its keyed bucket id (:func:`bucket_ids`):
the same matching, with neither order nor distance between windows.

What a holder of the hash values learns: for each row, L windows ``F_k <= (a_k . x + b_k) / r <
F_k + 1``; with ``L < d`` these leave infinitely many rows possible (the paper's Theorem 1), but
they do locate a row inside a slab of width ``r`` per function, and equal values across members
show which rows are close. Whoever also knows ``a`` and ``b`` can invert the values by least
squares (a row is then known to within the slabs), so in a job the functions come from a secret
only the members hold (:meth:`LshFunctions.from_secret`), never from data or the job's spec.

Pure numpy/numba; no protocol, no I/O.
"""

from __future__ import annotations

import hmac
import struct
from dataclasses import dataclass
from typing import Any

import numba
import numpy as np
import numpy.typing as npt

from workers import DataError
from workers.simfl.privacy import derive_key, standard_normal, uniform

DEFAULT_R = 4.0
"""Window width r; the paper's experiments use 4.0 (section "Experiments") on standardized
features."""

MAX_FUNCTIONS = 40
"""The paper's cap on L (``L = min(40, d - 1)``): more functions cost time and, past ``d - 1``,
the privacy argument (Theorem 1 needs ``L < d``)."""

_STREAM = 0x51F1
"""Mixed into the seed so the functions' stream differs from other uses of the same job seed
(e.g. tie breaking)."""

_INT32 = np.iinfo(np.int32)

HashArray = npt.NDArray[np.int32]
BucketArray = npt.NDArray[np.uint64]


def default_functions(n_features: int) -> int:
    """The paper's number of hash functions: ``min(40, d - 1)``, at least 1."""
    if n_features < 1:
        raise ValueError(f"n_features must be at least 1, got {n_features}")
    return max(1, min(MAX_FUNCTIONS, n_features - 1))


@dataclass(frozen=True, slots=True, eq=False)
class LshFunctions:
    """L p-stable hash functions ``F_k(v) = floor((a_k . v + b_k) / r)`` over d features.

    Attributes
    ----------
    a : (L, d) float64, entries N(0, 1) (2-stable).
    b : (L,) float64, uniform in [0, r).
    r : the window width, positive.

    The arrays are read-only copies; equality is by content via :meth:`same_as`.
    """

    a: npt.NDArray[np.float64]
    b: npt.NDArray[np.float64]
    r: float

    def __post_init__(self) -> None:
        a = np.array(self.a, dtype=np.float64)
        b = np.array(self.b, dtype=np.float64)
        r = float(self.r)
        if a.ndim != 2 or a.shape[0] < 1 or a.shape[1] < 1:
            raise ValueError(f"a must be a non-empty (L, d) matrix, got shape {a.shape}")
        if b.shape != (a.shape[0],):
            raise ValueError(f"b must have shape ({a.shape[0]},), got {b.shape}")
        if not np.isfinite(r) or r <= 0.0:
            raise ValueError(f"r must be a positive finite number, got {r}")
        if not (np.isfinite(a).all() and np.isfinite(b).all()):
            raise ValueError("a and b must be finite")
        a.setflags(write=False)
        b.setflags(write=False)
        object.__setattr__(self, "a", a)
        object.__setattr__(self, "b", b)
        object.__setattr__(self, "r", r)

    @property
    def functions(self) -> int:
        """L, the number of hash functions."""
        return int(self.a.shape[0])

    @property
    def n_features(self) -> int:
        """d, the number of features a row must have."""
        return int(self.a.shape[1])

    @classmethod
    def from_seed(cls, seed: int, n_features: int, functions: int, r: float) -> LshFunctions:
        """Functions from a public seed, for experiments (a job uses :meth:`from_secret`).

        The stream is ``numpy.random.default_rng([seed, n_features, functions, _STREAM])``, so
        the same arguments give the same functions on every member and numpy version that keeps
        PCG64 and ``standard_normal`` stable; ``b`` is drawn as ``U[0, 1) * r``.

        Raises
        ------
        ValueError
            If ``seed`` is negative, ``n_features`` or ``functions`` is below 1, or ``r`` is not
            a positive finite number.
        """
        if seed < 0:
            raise ValueError(f"seed must be non-negative, got {seed}")
        if n_features < 1 or functions < 1:
            raise ValueError(
                f"n_features and functions must be at least 1, got {n_features}, {functions}"
            )
        rng = np.random.default_rng([seed, n_features, functions, _STREAM])
        a = rng.standard_normal((functions, n_features))
        b = rng.random(functions) * float(r)
        return cls(a=a, b=b, r=r)

    @classmethod
    def from_secret(cls, secret: bytes, n_features: int, functions: int,
                    r: float) -> LshFunctions:
        """The functions of a job: ``a`` and ``b`` from ChaCha20 keystreams under keys derived
        from ``secret`` (which only the members hold), so that nobody without it can rebuild
        them (a seed's PCG64 stream would not do: its state follows from its outputs).

        Raises
        ------
        ValueError
            If ``secret`` is shorter than 32 bytes, ``n_features`` or ``functions`` is below
            1, or ``r`` is not a positive finite number.
        """
        if len(secret) < 32:
            raise ValueError(f"the LSH secret must have at least 32 bytes, got {len(secret)}")
        if n_features < 1 or functions < 1:
            raise ValueError(
                f"n_features and functions must be at least 1, got {n_features}, {functions}"
            )
        shape = f"{n_features}x{functions}"
        a = standard_normal(derive_key(secret, "simfl lsh projections v1", shape),
                            functions * n_features).reshape(functions, n_features)
        b = uniform(derive_key(secret, "simfl lsh offsets v1", shape), functions) * float(r)
        return cls(a=a, b=b, r=r)

    def same_as(self, other: LshFunctions) -> bool:
        """Whether ``other`` holds exactly the same functions."""
        return (
            self.r == other.r
            and np.array_equal(self.a, other.a)
            and np.array_equal(self.b, other.b)
        )

    def hash(self, x: npt.ArrayLike) -> HashArray:
        """The L hash values of each row: ``(n, d)`` features to ``(n, L)`` int32.

        A missing feature (NaN) counts as 0.0, the mean of standardized data, so a row with a
        gap still lands near rows like it on the other features.

        Raises
        ------
        ValueError
            If ``x`` is not ``(n, d)`` with this ``d``.
        workers.DataError
            If a value is infinite or a hash value leaves int32 (features far too large for
            ``r``; standardize them first).
        """
        rows = np.asarray(x, dtype=np.float64)
        if rows.ndim != 2 or rows.shape[1] != self.n_features:
            raise ValueError(
                f"rows must have shape (n, {self.n_features}), got {np.shape(rows)}"
            )
        rows = np.where(np.isnan(rows), 0.0, rows)
        with np.errstate(over="ignore", invalid="ignore"):
            windows = np.floor((rows @ self.a.T + self.b) / self.r)
        if not np.isfinite(windows).all():
            bad = int(np.argwhere(~np.isfinite(windows))[0, 0])
            raise DataError(f"row {bad}: hash value is not finite (infinite feature value)")
        out_of_range = (windows < _INT32.min) | (windows > _INT32.max)
        if out_of_range.any():
            bad = int(np.argwhere(out_of_range)[0, 0])
            raise DataError(
                f"row {bad}: hash value beyond int32 (features too large for r={self.r})"
            )
        return windows.astype(np.int32)


def bucket_ids(hashes: npt.ArrayLike, secret: bytes) -> BucketArray:
    """The hash values as the aggregator sees them: for function ``k`` and value ``v`` the first
    8 bytes of ``HMAC-SHA256(key, k || v)`` under a key derived from the members' secret.

    Equal values of one function give equal ids (all that the matching compares, so the most
    similar rows are the same as on the values); otherwise the ids are pseudorandom: neither
    the order of the windows nor their distance survives, and without the secret nobody can
    tell which window an id stands for. Ids of different functions are unrelated.

    Raises
    ------
    ValueError
        If ``hashes`` is not a 2-D integer array or ``secret`` is shorter than 32 bytes.
    """
    values = _hash_matrix(hashes, "hashes")
    if len(secret) < 32:
        raise ValueError(f"the LSH secret must have at least 32 bytes, got {len(secret)}")
    key = derive_key(secret, "simfl lsh bucket ids v1")
    out = np.empty(values.shape, dtype=np.uint64)
    for k in range(values.shape[1]):  # one HMAC per distinct window of each function
        windows, inverse = np.unique(values[:, k], return_inverse=True)
        ids = np.array([int.from_bytes(hmac.digest(key, struct.pack(">Iq", k, int(v)),
                                                   "sha256")[:8], "little") for v in windows],
                       dtype=np.uint64)
        out[:, k] = ids[inverse.reshape(-1)]
    return out


def most_similar(
    query: npt.ArrayLike, candidates: npt.ArrayLike,
    rng: np.random.Generator | npt.NDArray[np.float64]
) -> npt.NDArray[np.int64]:
    """For each query row, the candidate row with the most identical hash values (Alg. 1, l. 11).

    ``query`` is ``(nq, L)`` hash values of one member's rows, ``candidates`` ``(nc, L)`` those
    of another member's rows under the same functions. The count for a pair is the number of
    functions ``k`` with ``query[i, k] == candidates[j, k]``. Among the candidates with the
    highest count one is chosen uniformly at random with ``rng`` (the paper), or by ``rng``'s
    uniform in [0, 1) per query row when it is an array of them. A query row that
    shares no value with any candidate has every candidate tied at 0 and so gets a uniformly
    random candidate.

    As in the paper, each function's values are grouped into a hash table (bucket -> candidate
    rows) and a query row's count for a candidate is the number of its L buckets that hold the
    candidate. At r = 4 on standardized data a bucket holds a large share of all candidates
    (about half on Default of Credit Card Clients), so instead of walking bucket members the
    kernel compares small bucket ids per candidate, which gives the same counts with vectorised
    byte compares and memory ``O((nq + nc) L)``.

    Returns
    -------
    (nq,) int64 indices into ``candidates``.

    Raises
    ------
    ValueError
        If the arrays are not 2-D integer arrays with the same L, or there is no candidate.
    """
    queries = _hash_matrix(query, "query")
    table = _hash_matrix(candidates, "candidates")
    if queries.shape[1] != table.shape[1]:
        raise ValueError(
            f"query and candidates differ in L: {queries.shape[1]} != {table.shape[1]}"
        )
    if table.shape[0] == 0:
        raise ValueError("no candidate rows")
    query_buckets, candidate_buckets = _bucket_ids(queries, table)
    # One uniform per query row picks among its tied maxima; drawn up front so the result
    # depends only on rng's state, not on the kernel's order.
    picks = np.asarray(rng.random(queries.shape[0]) if isinstance(rng, np.random.Generator)
                       else rng, dtype=np.float64)
    if picks.shape != (queries.shape[0],):
        raise ValueError(f"{picks.shape} picks for {queries.shape[0]} query rows")
    counts_dtype = np.uint8 if table.shape[1] <= np.iinfo(np.uint8).max else np.uint16
    counts = np.zeros(table.shape[0], dtype=counts_dtype)
    return _most_similar_kernel(query_buckets, candidate_buckets, picks, counts)


def _hash_matrix(values: npt.ArrayLike, name: str) -> npt.NDArray[np.integer]:
    array = np.asarray(values)
    if array.ndim != 2 or not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"{name} must be a 2-D integer array, got {array.dtype} {array.shape}")
    return array


def _bucket_ids(
    queries: npt.NDArray[np.integer], table: npt.NDArray[np.integer]
) -> tuple[npt.NDArray[np.unsignedinteger], npt.NDArray[np.unsignedinteger]]:
    """Per function, the hash table of candidate values: bucket ids ``(nq, L)`` and ``(L, nc)``.

    A query value that no candidate has gets the id one past the last bucket, which no
    candidate carries.
    """
    functions = table.shape[1]
    tables = [np.unique(table[:, k], return_inverse=True) for k in range(functions)]
    widest = max(len(keys) for keys, _ in tables)
    dtype: type[np.unsignedinteger[Any]] = (np.uint8 if widest < np.iinfo(np.uint8).max
                                            else np.uint16)
    if widest >= np.iinfo(np.uint16).max:
        dtype = np.uint32
    candidate_buckets = np.empty((functions, table.shape[0]), dtype=dtype)
    query_buckets = np.empty(queries.shape, dtype=dtype)
    for k, (keys, inverse) in enumerate(tables):
        candidate_buckets[k] = inverse.reshape(-1)
        position = np.searchsorted(keys, queries[:, k])
        found = keys[np.minimum(position, len(keys) - 1)] == queries[:, k]
        query_buckets[:, k] = np.where(found, position, widest)
    return query_buckets, candidate_buckets


@numba.njit(cache=True, nogil=True)
def _most_similar_kernel(
    query_buckets, candidate_buckets, picks, counts
):
    # Per query row: count equal bucket ids per candidate (contiguous per function, so the inner
    # loop vectorises), then take the floor(pick * ties)-th of the candidates at the maximum.
    n_queries, functions = query_buckets.shape
    n_candidates = candidate_buckets.shape[1]
    chosen = np.empty(n_queries, dtype=np.int64)
    for i in range(n_queries):
        counts[:] = 0
        for k in range(functions):
            bucket = query_buckets[i, k]
            row = candidate_buckets[k]
            for j in range(n_candidates):
                counts[j] += row[j] == bucket
        best = counts.max()
        ties = 0
        for j in range(n_candidates):
            ties += counts[j] == best
        target = min(int(picks[i] * ties), ties - 1)
        for j in range(n_candidates):
            if counts[j] == best:
                if target == 0:
                    chosen[i] = j
                    break
                target -= 1
    return chosen
