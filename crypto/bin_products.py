"""Homomorphic bin sums: the products of ciphertexts per (feature, bin), the passive party's
share of SecureBoost (Alg. 1 lines 4-9) and of the vertical forest.

Two implementations of one function, the same numbers: ``crypto._bin_products`` (C on GMP's
mpn layer, Montgomery products, the interpreter's lock released; built with the package where
a C compiler and GMP's headers are found) and the loop over gmpy2 numbers below. ``NATIVE``
says which one runs; ``FEDBOOST_BIN_PRODUCTS=python`` chooses the loop (benchmarks compare
them). The C kernel's products cost about a third less than gmpy2's ``a * c % m`` and the loop's
per-product work in the interpreter goes away (docs/performance.md). The same products raise a
fixed base from its window table (:func:`window_powers`: the key holder's obfuscators under
both schemes, and ``g^m`` under OU).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from crypto._gmp import mpz

try:
    from crypto import _bin_products
except ImportError as exc:  # built without a C compiler or GMP's headers
    _bin_products = None  # type: ignore[assignment]  # optional: the Python path stands in
    _MISSING = repr(exc)
else:
    _MISSING = ""

NATIVE = _bin_products is not None and os.environ.get("FEDBOOST_BIN_PRODUCTS") != "python"
"""Whether bin products run in C (``crypto._bin_products``)."""


def kernel() -> str:
    """Which implementation runs, for logs and benchmark reports."""
    if NATIVE:
        return "c (gmp mpn, montgomery)"
    return "python (gmpy2)" + (f": the C kernel is not built ({_MISSING})" if _MISSING else "")


def bin_products(codes: np.ndarray, rows: np.ndarray, ciphertexts: Sequence[mpz], n_bins: int,
                 modulus: mpz, native: bool | None = None) -> list[mpz]:
    """Per feature and bin (feature-major), the product modulo ``modulus`` of the ciphertexts
    ``ciphertexts[rows[i]]`` of the rows ``i`` whose ``codes[i, feature]`` is that bin; 1 (the
    trivial encryption of 0) for a bin no row fell in."""
    if NATIVE if native is None else native:
        return _native(codes, rows, ciphertexts, n_bins, modulus)
    return _python(codes, rows, ciphertexts, n_bins, modulus)


def _native(codes: np.ndarray, rows: np.ndarray, ciphertexts: Sequence[mpz], n_bins: int,
            modulus: mpz) -> list[mpz]:
    if _bin_products is None:
        raise RuntimeError(f"the C bin-products kernel is not built: {_MISSING}")
    blob = _bin_products.bin_products(
        ciphertexts if isinstance(ciphertexts, list) else list(ciphertexts),
        np.ascontiguousarray(rows, dtype=np.int64), np.ascontiguousarray(codes, dtype=np.uint8),
        n_bins, mpz(modulus))
    return _numbers(blob, modulus)


def _numbers(blob: bytes, modulus: mpz) -> list[mpz]:
    """The C kernel's results: numbers of the modulus's width in little-endian 64-bit limbs."""
    width = 8 * -(-modulus.bit_length() // 64)
    return [mpz(int.from_bytes(blob[i:i + width], "little"))
            for i in range(0, len(blob), width)]


def _python(codes: np.ndarray, rows: np.ndarray, ciphertexts: Sequence[mpz], n_bins: int,
            modulus: mpz) -> list[mpz]:
    """Row by row: each ciphertext is read once and multiplied into one accumulator per feature,
    which all stay in cache; a pass per feature would stream every ciphertext once per feature."""
    n_features = codes.shape[1]
    acc: list[mpz | None] = [None] * (n_features * n_bins)
    slots = (codes.astype(np.int64) + np.arange(n_features) * n_bins).tolist()
    for row, row_slots in zip(np.asarray(rows).tolist(), slots, strict=True):
        c = ciphertexts[row]
        for slot in row_slots:
            a = acc[slot]
            acc[slot] = c if a is None else a * c % modulus
    one = mpz(1)  # the trivial encryption of 0 marks an empty bin
    return [one if a is None else a for a in acc]


def window_powers(rows: Sequence[Sequence[mpz]], exponents: Sequence[int], window_bits: int,
                  modulus: mpz, native: bool | None = None) -> list[mpz]:
    """``base^e mod modulus`` for each exponent from a fixed-base window table (``rows[i][d]``
    = ``base^(d * 2^(window_bits * i))``, every row as long as the exponents need): one product
    per nonzero window, in C when the kernel runs (the key holder's obfuscators, and ``g^m``
    under OU)."""
    if not exponents:
        return []
    if NATIVE if native is None else native:
        if _bin_products is None:
            raise RuntimeError(f"the C kernel is not built: {_MISSING}")
        width = max(1, (max(int(e) for e in exponents).bit_length() + 7) // 8)
        blob = _bin_products.window_powers(
            rows if isinstance(rows, list) else list(rows),
            b"".join(int(e).to_bytes(width, "little") for e in exponents), width, window_bits,
            mpz(modulus))
        return _numbers(blob, modulus)
    mask, out = (1 << window_bits) - 1, []
    for exponent in exponents:
        exponent, acc = int(exponent), mpz(1)
        for row in rows:
            if not exponent:
                break
            digit = exponent & mask
            if digit:
                acc = acc * row[digit] % modulus
            exponent >>= window_bits
        out.append(acc)
    return out
