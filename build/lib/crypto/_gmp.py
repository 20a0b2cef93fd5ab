"""The single seam to GMP (through gmpy2)."""

from __future__ import annotations

import secrets

import gmpy2
from gmpy2 import mpz

__all__ = ["mpz", "powmod", "invert", "jacobi", "random_below", "random_prime", "crt_pair"]

powmod = gmpy2.powmod
invert = gmpy2.invert
jacobi = gmpy2.jacobi


def random_below(bound: int) -> mpz:
    """Uniform integer in [1, bound) from the OS CSPRNG."""
    while True:
        value = secrets.randbelow(bound)
        if value > 0:
            return mpz(value)


def random_prime(bits: int) -> mpz:
    """A random prime of exactly ``bits`` bits (top two bits set so p*q has 2*bits bits)."""
    while True:
        candidate = mpz(secrets.randbits(bits)) | (mpz(3) << (bits - 2)) | 1
        prime = gmpy2.next_prime(candidate)
        if prime.bit_length() == bits and gmpy2.is_prime(prime, 50):
            return prime


def crt_pair(xp: mpz, xq: mpz, p: mpz, q: mpz, p_inv_mod_q: mpz) -> mpz:
    """The x mod p*q with x = xp mod p and x = xq mod q (Garner)."""
    return xp + p * ((xq - xp) * p_inv_mod_q % q)
