"""Cryptography for fedboost: Paillier on gmpy2, gradient packing, PSI.

This package imports nothing else of fedboost and never logs values.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from crypto._gmp import mpz


class CryptoError(ValueError):
    """A cryptographic operation got invalid input."""


class KeyMismatchError(CryptoError):
    """Values under different keys were combined."""


class OverflowRiskError(CryptoError):
    """Packed sums could overflow the plaintext space."""


class CiphertextSpace(Protocol):
    """What fixed-width ciphertext bytes need of a public key: any scheme's
    (``crypto.schemes.PublicKey``; the schemes import this package)."""

    scheme: str

    @property
    def ciphertext_bytes(self) -> int: ...

    @property
    def cipher_modulus(self) -> mpz: ...


__all__ = ["CiphertextSpace", "CryptoError", "KeyMismatchError", "OverflowRiskError"]
