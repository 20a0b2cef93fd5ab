"""Cryptography for fedboost: Paillier on gmpy2, gradient packing, PSI.

This package imports nothing else of fedboost and never logs values.
"""


class CryptoError(ValueError):
    """A cryptographic operation got invalid input."""


class KeyMismatchError(CryptoError):
    """Values under different keys were combined."""


class OverflowRiskError(CryptoError):
    """Packed sums could overflow the plaintext space."""


__all__ = ["CryptoError", "KeyMismatchError", "OverflowRiskError"]
