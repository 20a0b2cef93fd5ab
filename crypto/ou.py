"""Okamoto-Uchiyama encryption on gmpy2, with the interface of :mod:`crypto.paillier`'s keys.

Okamoto and Uchiyama, "A new public-key cryptosystem as secure as factoring", EUROCRYPT 1998:
``n = p^2 q``; ``g`` in ``Z_n^*`` whose ``g^(p-1) mod p^2`` has order p; ``h = g^n mod n``.
A plaintext ``m < p`` encrypts as ``c = g^m h^r mod n``; the key holder recovers it modulo
``p^2`` alone: ``m = L(c^(p-1)) / L(g^(p-1)) mod p`` with ``L(x) = (x - 1) / p`` (section 3.1),
since ``h^r`` raised to ``p-1`` vanishes modulo ``p^2`` (its order divides ``p - 1``). Sums add,
``E(a) E(b) = E(a + b)``, while they stay below p.

Against Paillier at the same modulus size: ciphertexts, products and obfuscators are modulo
``n`` (2048 bits) instead of ``n^2`` (4096), a ciphertext is half the bytes, and plaintexts are
smaller (below p, a third of n's bits), so fewer packed sums fit one ciphertext
(``plaintext_bits``: capacity is derived from it, never assumed).

Public key from n alone: ``g`` is derived from ``n`` by hashing (:func:`_derive_g`), so that
what travels is the modulus, as for Paillier. A hashed ``g`` is a uniform element of ``Z_n``,
the distribution the paper's key generation draws from; the key holder checks it has the
order the scheme needs and draws new primes in the rare case it does not (probability ~1/p).

Obfuscators: ``h^r`` with a short random exponent (``short``, as for Paillier: the same
``OBFUSCATOR_EXPONENT_BITS`` and the same argument, :mod:`crypto.paillier`'s docstring;
SecretFlow's HEU draws 110-bit exponents at this key size) from a fixed-base window table, or
a uniform ``r`` in ``[1, n)`` (``full``). The key holder computes both parts of a ciphertext
modulo ``p^2`` and ``q`` and joins them once by CRT.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from crypto import CryptoError, KeyMismatchError
from crypto._gmp import crt_pair, invert, mpz, powmod, random_below, random_prime
from crypto.paillier import (OBFUSCATOR_EXPONENT_BITS, OBFUSCATORS, KeyHolder, _FixedBaseTable,
                             fold_runs, take_obfuscators)

SCHEME = "ou"

DEFAULT_KEY_BITS = 2048
"""n = p^2 q of 2048 bits: NIST SP 800-57 Part 1 puts a 2048-bit factoring modulus at 112-bit
security; factoring p^2 q is no easier at this size (docs/crypto.md)."""

MIN_KEY_BITS = 768
"""Below this, p (a third of n) is too small to hold even one packed row's sums."""

PLAIN_WINDOW_BITS = 12
"""Fixed-base windows for ``g^m``, as for obfuscators; rows are built as plaintexts reach them
(:func:`_plain_table`), so packed gradients (~130 bits) need 11 rows, not the 57 that reach
p's bits at 2048."""


def _plain_table(base: mpz, modulus: mpz) -> _FixedBaseTable:
    """``base^m mod modulus`` for plaintexts ``m``: rows built as plaintexts reach them."""
    return _FixedBaseTable(base, modulus, PLAIN_WINDOW_BITS, exponent_bits=0)


def _derive_g(n: mpz) -> mpz:
    """The public base ``g``: n's bytes hashed (SHAKE-256) to a number below n."""
    width = (n.bit_length() + 7) // 8
    seed = b"fedboost okamoto-uchiyama g\0" + int(n).to_bytes(width, "big")
    g = mpz(int.from_bytes(hashlib.shake_256(seed).digest(width + 16), "big")) % n
    return g if g > 1 else mpz(2)


def _split_bits(n_bits: int) -> tuple[int, int]:
    """Bits of p and of q for an ``n_bits``-bit ``p^2 q``: thirds, q taking what is left."""
    p_bits = n_bits // 3
    return p_bits, n_bits - 2 * p_bits


@dataclass(eq=False)
class OUPublicKey:
    """Public key ``n = p^2 q`` (``g`` and ``h`` follow from it); equal keys compare by ``n``."""

    n: mpz
    scheme: str = field(init=False, default=SCHEME)
    g: mpz = field(init=False)
    h: mpz = field(init=False)
    plaintext_bits: int = field(init=False)
    """Packed plaintexts stay below ``2**(plaintext_bits - 1)``, which is below p."""
    _plain_table: _FixedBaseTable | None = field(init=False, default=None, repr=False)
    _table: _FixedBaseTable | None = field(init=False, default=None, repr=False)

    def __post_init__(self) -> None:
        self.n = mpz(self.n)
        self.g = _derive_g(self.n)
        self.h = powmod(self.g, self.n, self.n)
        self.plaintext_bits = _split_bits(self.n.bit_length())[0]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, OUPublicKey) and self.n == other.n

    def __hash__(self) -> int:
        return hash(("ou", int(self.n)))

    @property
    def cipher_modulus(self) -> mpz:
        """Ciphertexts are residues modulo n."""
        return self.n

    @property
    def max_plaintext(self) -> int:
        """The largest plaintext :meth:`raw_encrypt` takes."""
        return (1 << (self.plaintext_bits - 1)) - 1

    @property
    def n_bytes(self) -> bytes:
        """The modulus as it travels: big-endian, no leading zero bytes."""
        n = int(self.n)
        return n.to_bytes((n.bit_length() + 7) // 8, "big")

    @property
    def ciphertext_bytes(self) -> int:
        """Fixed width of a ciphertext on the wire."""
        return (int(self.n.bit_length()) + 7) // 8

    def _check_plaintext(self, m: int) -> None:
        if not 0 <= m <= self.max_plaintext:
            raise CryptoError(f"plaintext outside [0, 2^{self.plaintext_bits - 1})")

    def g_power(self, m: int) -> mpz:
        """``g^m mod n`` (the plaintext part of a ciphertext; a known plaintext's encryption
        without obfuscator, for adding it to a ciphertext)."""
        if self._plain_table is None:
            self._plain_table = _plain_table(self.g, self.n)
        return self._plain_table.power(m)

    def _obfuscator(self) -> mpz:
        if self._table is None:
            self._table = _FixedBaseTable(self.h, self.n)
        return self._table.power(secrets.randbits(OBFUSCATOR_EXPONENT_BITS))

    def raw_encrypt(self, plaintext: int) -> mpz:
        """Encrypt an integer in [0, 2^(plaintext_bits - 1)) with a fresh obfuscator."""
        self._check_plaintext(plaintext)
        return self.g_power(plaintext) * self._obfuscator() % self.n

    def encrypt_batch(self, plaintexts: Iterable[int]) -> list[mpz]:
        """Encrypt many integers."""
        return [self.raw_encrypt(m) for m in plaintexts]

    def add(self, c1: mpz, c2: mpz) -> mpz:
        """Homomorphic addition: E(a) (+) E(b) = E(a + b)."""
        return c1 * c2 % self.n

    def add_plain(self, c: mpz, m: int) -> mpz:
        """E(a) (+) m = E(a + m) for a known m >= 0 (the ciphertext's obfuscator covers it)."""
        return mpz(c) * powmod(self.g, m, self.n) % self.n

    def scalar_mul(self, c: mpz, k: int) -> mpz:
        """Homomorphic scalar product E(a) (x) k = E(a * k), k >= 0."""
        return powmod(c, k, self.n)

    def check_ciphertext(self, c: int) -> None:
        """Reject values that cannot be ciphertexts under this key."""
        if not 0 < c < self.n:
            raise CryptoError("ciphertext outside (0, n)")


@dataclass(eq=False)
class OUPrivateKey(KeyHolder):
    """Private key ``(p, q)``. It has no wire codec: it never leaves the key holder."""

    public_key: OUPublicKey
    p: mpz
    q: mpz
    obfuscator: str = "short"
    """``short`` or ``full``, as for Paillier (module docstring)."""
    psquare: mpz = field(init=False)
    gp_inverse: mpz = field(init=False)
    """``L(g^(p-1) mod p^2)^-1 mod p``, the decryption's constant."""
    _psq_inv: mpz = field(init=False)
    _plain_tables: tuple[_FixedBaseTable, _FixedBaseTable] | None = field(init=False, default=None)
    _tables: tuple[_FixedBaseTable, _FixedBaseTable] | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        if self.obfuscator not in OBFUSCATORS:
            raise CryptoError(f"obfuscator {self.obfuscator!r} is not one of {OBFUSCATORS}")
        self.p, self.q = mpz(self.p), mpz(self.q)
        self.psquare = self.p * self.p
        if self.psquare * self.q != self.public_key.n:
            raise KeyMismatchError("p^2 * q does not equal the public key's n")
        gp = _l_function(powmod(self.public_key.g % self.psquare, self.p - 1, self.psquare),
                         self.p)
        if gp % self.p == 0:
            raise KeyMismatchError("g^(p-1) has no order p modulo p^2: not a usable OU key")
        self.gp_inverse = invert(gp, self.p)
        self._psq_inv = invert(self.psquare, self.q)

    def __repr__(self) -> str:  # never print the factors
        return f"OUPrivateKey(n_bits={self.public_key.n.bit_length()})"

    @property
    def obfuscator_moduli(self) -> tuple[mpz, mpz]:
        """The moduli of an obfuscator's two residues (p^2 and q)."""
        return self.psquare, self.q

    def _decrypt_mod_psquare(self, c: mpz) -> mpz:
        return _l_function(powmod(c, self.p - 1, self.psquare), self.p) * self.gp_inverse \
            % self.p

    def raw_decrypt(self, ciphertext: int) -> mpz:
        """Decrypt to the integer in [0, p) (only ``c mod p^2`` is needed)."""
        c = mpz(ciphertext)
        self.public_key.check_ciphertext(c)
        return self._decrypt_mod_psquare(c % self.psquare)

    def decrypt_folded(self, ciphertexts: Sequence[int], shift_bits: int, run: int) -> list[mpz]:
        """As :meth:`crypto.paillier.PaillierPrivateKey.decrypt_folded`: each run of ``run``
        ciphertexts folded by Horner's rule modulo p^2 and decrypted once; runs stay below p
        (``run * shift_bits < p.bit_length()``)."""
        return [self._decrypt_mod_psquare(acc)
                for acc in fold_runs(ciphertexts, shift_bits, run, self.p, self.psquare,
                                     self.public_key.check_ciphertext)]

    def _short_tables(self) -> tuple[_FixedBaseTable, _FixedBaseTable]:
        """The window tables of ``h`` modulo p^2 and q (built on first use)."""
        if self._tables is None:
            h = self.public_key.h
            self._tables = (_FixedBaseTable(h, self.psquare), _FixedBaseTable(h, self.q))
        return self._tables

    def _g_powers(self, plaintexts: list[int]) -> tuple[list[mpz], list[mpz]]:
        """``g^m`` modulo p^2 and modulo q of each plaintext, from window tables over the
        plaintexts' bits."""
        if self._plain_tables is None:
            g = self.public_key.g
            self._plain_tables = (_plain_table(g, self.psquare), _plain_table(g, self.q))
        tp, tq = self._plain_tables
        return tp.powers(plaintexts), tq.powers(plaintexts)

    def _full_obfuscator(self) -> tuple[mpz, mpz]:
        """A uniform r's h^r modulo p^2 and q (exponents reduced mod the groups' orders)."""
        r = random_below(self.public_key.n)
        h = self.public_key.h
        return (powmod(h, r % (self.p * (self.p - 1)), self.psquare),
                powmod(h, r % (self.q - 1), self.q))

    def encrypt_batch(self, plaintexts: Iterable[int],
                      spare: list[tuple[mpz, mpz]] | None = None) -> list[mpz]:
        """Encrypt as the key holder: ``g^m h^r`` modulo p^2 and q, joined once by CRT;
        obfuscators from the end of ``spare`` while it lasts (each taken out), then fresh."""
        psquare, q, inverse = self.psquare, self.q, self._psq_inv
        plaintexts = list(plaintexts)
        for m in plaintexts:
            self.public_key._check_plaintext(m)
        out = []
        for gp, gq, (rp, rq) in zip(*self._g_powers(plaintexts),
                                    take_obfuscators(spare, len(plaintexts), self.obfuscators),
                                    strict=True):
            out.append(crt_pair(gp * rp % psquare, gq * rq % q, psquare, q, inverse))
        return out


def _l_function(x: mpz, p: mpz) -> mpz:
    return (x - 1) // p


def generate_keypair(n_bits: int = DEFAULT_KEY_BITS, obfuscator: str = "short"
                     ) -> tuple[OUPublicKey, OUPrivateKey]:
    """A fresh key pair whose ``n = p^2 q`` has exactly ``n_bits`` bits."""
    if n_bits < MIN_KEY_BITS or n_bits % 2:
        raise CryptoError(f"key size {n_bits} must be even and at least {MIN_KEY_BITS} bits")
    p_bits, q_bits = _split_bits(n_bits)
    while True:
        p, q = random_prime(p_bits), random_prime(q_bits)
        n = p * p * q
        if p == q or n.bit_length() != n_bits:
            continue
        public = OUPublicKey(n)
        try:
            return public, OUPrivateKey(public, p, q, obfuscator)
        except KeyMismatchError:  # the hashed g lacks order p modulo p^2 (~1/p): new primes
            continue


def public_key_from_n(n: int, expected_bits: int | None = None) -> OUPublicKey:
    """A public key from a received modulus, checking its size."""
    n = int(n)
    if n <= 0 or n % 2 == 0:
        raise CryptoError("public key modulus must be a positive odd integer")
    if expected_bits is not None and n.bit_length() != expected_bits:
        raise CryptoError(f"public key has {n.bit_length()} bits, expected {expected_bits}")
    if n.bit_length() < MIN_KEY_BITS:
        raise CryptoError(f"an OU modulus of {n.bit_length()} bits is below {MIN_KEY_BITS}")
    return OUPublicKey(mpz(n))


__all__ = ["OUPublicKey", "OUPrivateKey", "generate_keypair", "public_key_from_n", "SCHEME"]
