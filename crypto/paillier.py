"""Paillier encryption on gmpy2, interoperable with ``phe`` keys.

Names follow the paper and ``phe``: ``n``, ``nsquare``, ``g = n + 1``, ``p``, ``q``.
Encryption is ``c = (1 + m*n) * r^n mod n^2``. The obfuscator ``r^n`` dominates the cost. The
key holder draws it one of two ways (its policy's ``obfuscator``):

``short`` (default): ``hs^a`` with ``hs = (-x^2)^n mod n^2`` for a secret random ``x`` and a
short random exponent ``a`` (Damgard, Jurik and Nielsen, "A generalization of Paillier's
public-key system", section 4.1). This is an ``n``-th residue like ``r^n``, but drawn from the
subgroup ``hs`` generates with an exponent of ``OBFUSCATOR_EXPONENT_BITS`` bits instead of a
uniform one. Besides the decisional composite residuosity assumption that Paillier rests on, it
assumes the *short exponent* assumption: ``hs^a`` for a short random ``a`` cannot be told apart
from a uniform element of that subgroup, which holds when discrete logarithms with short
exponents are hard there (Koshiba and Kurosawa, "Short exponent Diffie-Hellman problems",
PKC 2004). The best known attacks on a short exponent (Pollard's lambda / kangaroo method,
van Oorschot and Wiener, "On Diffie-Hellman key agreement with short exponents", EUROCRYPT
1996) take about ``2^(bits/2)`` steps, so ``a`` has twice the key's security level in bits. A
fixed-base window table turns each ``hs^a`` into ~22 products; the key holder builds it modulo
``p^2`` and ``q^2`` (CRT), which is about twice as fast.

``full``: a uniform ``r`` in ``[1, n)`` and a full ``r^n``, Paillier's own obfuscator, resting on
decisional composite residuosity alone; the key holder computes it modulo ``p^2`` and ``q^2``
with the exponent reduced modulo ``p(p-1)`` and ``q(q-1)`` (CRT). Slower (docs/performance.md).

Either way the ciphertexts are ordinary Paillier ciphertexts: ``phe`` decrypts them.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from crypto import CiphertextSpace, CryptoError, KeyMismatchError, OverflowRiskError
from crypto._gmp import crt_pair, invert, mpz, powmod, random_below, random_prime
from crypto.bin_products import window_powers

DEFAULT_KEY_BITS = 2048
"""NIST SP 800-57 puts 2048-bit factoring moduli at 112-bit security, acceptable to 2030."""

OBFUSCATOR_EXPONENT_BITS = 256
"""2 x 128: at least twice the security level of every key size we accept (NIST SP 800-57:
112 bits at 2048, 128 at 3072; 4096-bit keys, about 150 bits, keep this 128-bit margin), since
Pollard's lambda method finds a b-bit exponent in about 2^(b/2) steps."""

OBFUSCATORS = ("short", "full")
"""How the key holder draws obfuscators (module docstring)."""

WINDOW_BITS = 12
"""Fixed-base windows: 22 multiplications per 256-bit exponent (8-bit windows took 32) for a
table of 22 x 4096 residues (about 23 MB per prime factor at 2048 bits, built once per key)."""


class _FixedBaseTable:
    """``base^a mod modulus`` by fixed windows: ``rows[i][d] = base^(d * 2^(window_bits * i))``,
    one product per nonzero window of ``a``. The rows for ``exponent_bits``-bit exponents are
    built at once; longer exponents grow the table as they come (OU's ``g^m``: plaintexts far
    shorter than p need only the rows they reach)."""

    def __init__(self, base: mpz, modulus: mpz, window_bits: int = WINDOW_BITS,
                 exponent_bits: int = OBFUSCATOR_EXPONENT_BITS) -> None:
        self.modulus, self.window_bits = modulus, window_bits
        self.rows: list[list[mpz]] = []
        self._next = base % modulus  # base^(2^(window_bits * len(rows)))
        self._grow(-(-exponent_bits // window_bits))

    def _grow(self, rows: int) -> None:
        while len(self.rows) < rows:
            step, modulus = self._next, self.modulus
            row = [mpz(1), step]
            for _ in range(2, 1 << self.window_bits):
                row.append(row[-1] * step % modulus)
            self.rows.append(row)
            self._next = row[-1] * step % modulus

    def _reach(self, exponents: Sequence[int]) -> None:
        bits = max((int(e).bit_length() for e in exponents), default=0)
        self._grow(-(-bits // self.window_bits))

    def power(self, exponent: int) -> mpz:
        """One power, by the interpreter's loop: for a single exponent the C kernel's set-up
        (powers of its Montgomery radix) would cost as much as the products."""
        return self.powers([exponent], native=False)[0]

    def powers(self, exponents: Sequence[int], native: bool | None = None) -> list[mpz]:
        """Many powers at once, in C when the kernel is built (``crypto.bin_products``;
        ``native`` chooses, as there)."""
        self._reach(exponents)
        return window_powers(self.rows, exponents, self.window_bits, self.modulus, native)


def short_obfuscators(tables: tuple[_FixedBaseTable, _FixedBaseTable], count: int,
                      native: bool | None = None) -> list[tuple[mpz, mpz]]:
    """``count`` short-exponent obfuscators ``hs^a`` (module docstring) as residues modulo the
    two tables' moduli, each with its own random ``a``, the same in both residues (``native``:
    the C kernel, its loop, or whichever runs; benchmarks compare them)."""
    exponents = [secrets.randbits(OBFUSCATOR_EXPONENT_BITS) for _ in range(count)]
    return list(zip(tables[0].powers(exponents, native), tables[1].powers(exponents, native),
                    strict=True))


def take_obfuscators(spare: list[tuple[mpz, mpz]] | None, count: int,
                     fresh: Callable[[int], list[tuple[mpz, mpz]]]) -> list[tuple[mpz, mpz]]:
    """``count`` obfuscators for a batch: taken out of the end of ``spare`` (so never used
    twice) while it lasts, the rest made now by ``fresh``, all at once."""
    taken = [spare.pop() for _ in range(min(count, len(spare)))] if spare else []
    return taken + fresh(count - len(taken))


@dataclass(eq=False)
class PaillierPublicKey:
    """Public key ``n``; equal keys compare equal by ``n``."""

    n: mpz
    scheme: str = field(init=False, default="paillier")
    nsquare: mpz = field(init=False)
    max_int: mpz = field(init=False)
    plaintext_bits: int = field(init=False)
    """Packed plaintexts stay below ``2**(plaintext_bits - 1)``, which is below n."""
    _table: _FixedBaseTable | None = field(init=False, default=None, repr=False)

    def __post_init__(self) -> None:
        self.n = mpz(self.n)
        self.nsquare = self.n * self.n
        self.max_int = self.n // 3 - 1
        self.plaintext_bits = self.n.bit_length()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PaillierPublicKey) and self.n == other.n

    def __hash__(self) -> int:
        return hash(int(self.n))

    @property
    def cipher_modulus(self) -> mpz:
        """Ciphertexts are residues modulo n^2."""
        return self.nsquare

    @property
    def max_plaintext(self) -> int:
        """The largest plaintext :meth:`raw_encrypt` takes."""
        return int(self.n) - 1

    @property
    def n_bytes(self) -> bytes:
        """The modulus as it travels: big-endian, no leading zero bytes."""
        n = int(self.n)
        return n.to_bytes((n.bit_length() + 7) // 8, "big")

    @property
    def ciphertext_bytes(self) -> int:
        """Fixed width of a ciphertext on the wire."""
        return (int(self.nsquare.bit_length()) + 7) // 8

    def _obfuscator(self) -> mpz:
        if self._table is None:
            x = random_below(self.n)
            hs = powmod(self.n - x * x % self.n, self.n, self.nsquare)
            self._table = _FixedBaseTable(hs, self.nsquare)
        return self._table.power(secrets.randbits(OBFUSCATOR_EXPONENT_BITS))

    def raw_encrypt(self, plaintext: int) -> mpz:
        """Encrypt an integer in [0, n) with a fresh obfuscator."""
        if not 0 <= plaintext < self.n:
            raise CryptoError("plaintext outside [0, n)")
        return (1 + mpz(plaintext) * self.n) % self.nsquare * self._obfuscator() % self.nsquare

    def encrypt_batch(self, plaintexts: Iterable[int]) -> list[mpz]:
        """Encrypt many integers in [0, n)."""
        return [self.raw_encrypt(m) for m in plaintexts]

    def add(self, c1: mpz, c2: mpz) -> mpz:
        """Homomorphic addition: E(a) (+) E(b) = E(a + b)."""
        return c1 * c2 % self.nsquare

    def add_plain(self, c: mpz, m: int) -> mpz:
        """E(a) (+) m = E(a + m) for a known m >= 0: a product with ``(1 + m*n)`` (no
        obfuscator: the ciphertext's own randomness covers it)."""
        return mpz(c) * (1 + mpz(m) * self.n) % self.nsquare

    def scalar_mul(self, c: mpz, k: int) -> mpz:
        """Homomorphic scalar product E(a) (x) k = E(a * k), k >= 0."""
        return powmod(c, k, self.nsquare)

    def check_ciphertext(self, c: int) -> None:
        """Reject values that cannot be ciphertexts under this key."""
        if not 0 < c < self.nsquare:
            raise CryptoError("ciphertext outside (0, n^2)")


class KeyHolder:
    """What a private key of either scheme does the same way (``crypto.ou`` shares it); each
    scheme's key brings ``p``, ``obfuscator``, ``raw_decrypt``, ``_short_tables`` and
    ``_full_obfuscator``."""

    p: mpz
    obfuscator: str

    if TYPE_CHECKING:  # each scheme's own
        def raw_decrypt(self, ciphertext: int) -> mpz: ...
        def _short_tables(self) -> tuple[_FixedBaseTable, _FixedBaseTable]: ...
        def _full_obfuscator(self) -> tuple[mpz, mpz]: ...

    def obfuscators(self, count: int) -> list[tuple[mpz, mpz]]:
        """``count`` fresh obfuscators (residues modulo the key's two obfuscator moduli), made
        ahead of the plaintexts they will hide: they do not depend on them. Each must be used
        once (``encrypt_batch``'s ``spare``) and, like the key, never leaves the key holder."""
        if self.obfuscator == "full":
            return [self._full_obfuscator() for _ in range(count)]
        return short_obfuscators(self._short_tables(), count)

    def decrypt_batch(self, ciphertexts: Sequence[int]) -> list[mpz]:
        """Decrypt many ciphertexts."""
        return [self.raw_decrypt(c) for c in ciphertexts]

    def fold_run(self, shift_bits: int) -> int:
        """The longest run ``decrypt_folded`` takes for sums of ``shift_bits`` bits (runs stay
        below p)."""
        return (int(self.p.bit_length()) - 1) // shift_bits


@dataclass(eq=False)
class PaillierPrivateKey(KeyHolder):
    """Private key ``(p, q)``. It has no wire codec: it never leaves the key holder."""

    public_key: PaillierPublicKey
    p: mpz
    q: mpz
    obfuscator: str = "short"
    """``short`` (a short exponent on a fixed base) or ``full`` (a uniform r^n): see the module
    docstring."""
    psquare: mpz = field(init=False)
    qsquare: mpz = field(init=False)
    hp: mpz = field(init=False)
    hq: mpz = field(init=False)
    p_inverse: mpz = field(init=False)
    _psq_inv: mpz = field(init=False)
    _tables: tuple[_FixedBaseTable, _FixedBaseTable] | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        if self.obfuscator not in OBFUSCATORS:
            raise CryptoError(f"obfuscator {self.obfuscator!r} is not one of {OBFUSCATORS}")
        self.p, self.q = mpz(self.p), mpz(self.q)
        if self.p * self.q != self.public_key.n:
            raise KeyMismatchError("p * q does not equal the public key's n")
        if self.q < self.p:
            self.p, self.q = self.q, self.p
        self.psquare, self.qsquare = self.p * self.p, self.q * self.q
        self.p_inverse = invert(self.p, self.q)
        self._psq_inv = invert(self.psquare, self.qsquare)
        self.hp = self._h_function(self.p, self.psquare)
        self.hq = self._h_function(self.q, self.qsquare)

    def __repr__(self) -> str:  # never print the factors
        return f"PaillierPrivateKey(n_bits={self.public_key.n.bit_length()})"

    @property
    def obfuscator_moduli(self) -> tuple[mpz, mpz]:
        """The moduli of an obfuscator's two residues (p^2 and q^2)."""
        return self.psquare, self.qsquare

    def _h_function(self, x: mpz, xsquare: mpz) -> mpz:
        return invert(_l_function(powmod(self.public_key.n + 1, x - 1, xsquare), x), x)

    def raw_decrypt(self, ciphertext: int) -> mpz:
        """Decrypt to the integer in [0, n), by CRT."""
        c = mpz(ciphertext)
        self.public_key.check_ciphertext(c)
        mp = _l_function(powmod(c, self.p - 1, self.psquare), self.p) * self.hp % self.p
        mq = _l_function(powmod(c, self.q - 1, self.qsquare), self.q) * self.hq % self.q
        return crt_pair(mp, mq, self.p, self.q, self.p_inverse)

    def decrypt_folded(self, ciphertexts: Sequence[int], shift_bits: int, run: int) -> list[mpz]:
        """Decrypt ``sum_j m_j * 2**(shift_bits * (k - 1 - j))`` for each run of ``run``
        ciphertexts (the last run may be shorter): the plaintext a sender's Horner fold
        ``acc^(2**shift_bits) * c`` would carry (``crypto.compress``), folded here instead.

        Runs are kept below p (``run * shift_bits < p.bit_length()``), so a run's plaintext is
        its own residue modulo p: the fold and the decryption need p^2 only, whose squarings
        cost about an eighth of the sender's modulo n^2, and no CRT.
        """
        p = self.p
        return [_l_function(powmod(acc, p - 1, self.psquare), p) * self.hp % p
                for acc in fold_runs(ciphertexts, shift_bits, run, p, self.psquare,
                                     self.public_key.check_ciphertext)]

    def _short_tables(self) -> tuple[_FixedBaseTable, _FixedBaseTable]:
        """The window tables of ``hs`` modulo p^2 and q^2 (built on first use)."""
        if self._tables is None:
            n = self.public_key.n
            x = random_below(n)
            hs = powmod(n - x * x % n, n, self.public_key.nsquare)
            self._tables = (_FixedBaseTable(hs, self.psquare), _FixedBaseTable(hs, self.qsquare))
        return self._tables

    def _full_obfuscator(self) -> tuple[mpz, mpz]:
        """A uniform r's r^n modulo p^2 and q^2 (exponents reduced mod p(p-1), q(q-1))."""
        n = self.public_key.n
        r = random_below(n)
        return (powmod(r, n % (self.p * (self.p - 1)), self.psquare),
                powmod(r, n % (self.q * (self.q - 1)), self.qsquare))

    def encrypt_batch(self, plaintexts: Iterable[int],
                      spare: list[tuple[mpz, mpz]] | None = None) -> list[mpz]:
        """Encrypt as the key holder: the whole ciphertext ``(1 + mn) r^n`` is computed modulo
        p^2 and q^2 (half-size numbers) and joined once by CRT. Obfuscators come from the end
        of ``spare`` (:meth:`obfuscators`; each taken out, so never used twice) while it
        lasts, then fresh."""
        n = self.public_key.n
        psquare, qsquare, inverse = self.psquare, self.qsquare, self._psq_inv
        plaintexts = list(plaintexts)
        for m in plaintexts:
            if not 0 <= m < n:
                raise CryptoError("plaintext outside [0, n)")
        out = []
        for m, (rp, rq) in zip(plaintexts, take_obfuscators(spare, len(plaintexts),
                                                            self.obfuscators), strict=True):
            g_m = 1 + mpz(m) * n
            out.append(crt_pair(g_m % psquare * rp % psquare, g_m % qsquare * rq % qsquare,
                                psquare, qsquare, inverse))
        return out


def _l_function(x: mpz, p: mpz) -> mpz:
    return (x - 1) // p


def fold_runs(ciphertexts: Sequence[int], shift_bits: int, run: int, p: mpz, psquare: mpz,
              check: Callable[[int], None]) -> list[mpz]:
    """Each run of ``run`` ciphertexts folded by Horner's rule modulo p^2 (``acc^(2**shift_bits)
    * c``), each ciphertext checked first; runs must stay below p (``run * shift_bits <
    p.bit_length()``). Both schemes' key holders decrypt a run's fold modulo p^2 alone."""
    if run < 1 or shift_bits < 1 or run * shift_bits >= p.bit_length():
        raise OverflowRiskError(f"runs of {run} ciphertexts shifted by {shift_bits} bits do "
                                f"not stay below a {p.bit_length()}-bit p")
    shift = mpz(1) << shift_bits
    out = []
    for start in range(0, len(ciphertexts), run):
        acc = None
        for c in ciphertexts[start:start + run]:
            c = mpz(c)
            check(c)
            acc = c % psquare if acc is None else powmod(acc, shift, psquare) * c % psquare
        out.append(acc)
    return out


def generate_keypair(n_bits: int = DEFAULT_KEY_BITS, obfuscator: str = "short"
                     ) -> tuple[PaillierPublicKey, PaillierPrivateKey]:
    """A fresh key pair whose modulus has exactly ``n_bits`` bits; the private key encrypts
    with ``obfuscator`` (module docstring)."""
    if n_bits < 256 or n_bits % 2:
        raise CryptoError(f"key size {n_bits} must be even and at least 256 bits")
    while True:
        p = random_prime(n_bits // 2)
        q = random_prime(n_bits // 2)
        if p != q and (p * q).bit_length() == n_bits:
            break
    public = PaillierPublicKey(p * q)
    return public, PaillierPrivateKey(public, p, q, obfuscator)


def ciphertexts_to_bytes(ciphertexts: Sequence[int], public_key: CiphertextSpace) -> bytes:
    """Fixed-width big-endian bytes, ``public_key.ciphertext_bytes`` per ciphertext (any
    scheme's key: ``crypto.schemes.PublicKey``)."""
    width = public_key.ciphertext_bytes
    return b"".join(int(c).to_bytes(width, "big") for c in ciphertexts)


def ciphertexts_from_bytes(blob: bytes, public_key: CiphertextSpace) -> list[mpz]:
    """Inverse of :func:`ciphertexts_to_bytes`, rejecting bad lengths and out-of-range values."""
    width = public_key.ciphertext_bytes
    if len(blob) % width:
        raise CryptoError(f"ciphertext batch of {len(blob)} bytes is not a multiple of {width}")
    modulus = public_key.cipher_modulus
    out = []
    for start in range(0, len(blob), width):
        c = mpz(int.from_bytes(blob[start:start + width], "big"))
        if not 0 < c < modulus:
            raise CryptoError(f"ciphertext {start // width} outside (0, {public_key.scheme} "
                              f"ciphertext modulus)")
        out.append(c)
    return out


def public_key_from_n(n: int, expected_bits: int | None = None) -> PaillierPublicKey:
    """A public key from a received modulus, checking its size."""
    n = int(n)
    if n <= 0 or n % 2 == 0:
        raise CryptoError("public key modulus must be a positive odd integer")
    if expected_bits is not None and n.bit_length() != expected_bits:
        raise CryptoError(f"public key has {n.bit_length()} bits, expected {expected_bits}")
    return PaillierPublicKey(mpz(n))
