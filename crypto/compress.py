"""Several encrypted bin sums in one ciphertext for the trip back ("cipher compression").

A bin sum decrypts to a plaintext below ``2**cell_bits`` (the three slots of
:class:`crypto.encoding.GradientPacker`), far less than n. The passive party folds
``per_ciphertext`` sums into one ciphertext by Horner's rule on ciphertexts:
``acc^(2**cell_bits) * E(b) = E(acc * 2**cell_bits + b)``. The key holder decrypts once per
``per_ciphertext`` sums and cuts the plaintext into the very integers it would have decrypted one
by one. Packed plaintexts stay below ``2**(n_bits - 1) < n``, so nothing wraps modulo n.

Cost: a shift is ``cell_bits`` squarings modulo n^2 for the passive party; each saved CRT
decryption is two half-size exponentiations for the key holder. ``python -m benchmarks.crypto``
measures both (at 2048 bits a shift is about a third of a decryption).

Who folds: the key holder can fold runs itself, and cheaper: runs short enough to stay below
p are their own residues modulo p, so it folds and decrypts modulo p^2 only, where a squaring
costs about an eighth of one modulo n^2 (:func:`decrypt_bin_sums`). Sent one sum per
ciphertext (16x the bytes of a histogram message), folded and decrypted by the key holder, a
bin sum costs a fraction of the CPU it costs folded by the sender (``python -m
benchmarks.crypto`` prints both): ``crypto.pack_bin_sums: key_holder``, which a passive party
allows only if its own policy lists it; ``passive`` (the default) keeps the fold with the
sender, under random high bits.

What the key holder learns is unchanged: the same bin sums, and which bins are empty. Empty bins
(the trivial ciphertext 1) used to travel as such; now they travel as a mask and are not packed,
which saves their shifts. A sender that folds can also fill each plaintext's bits above its
sums with random ones (``pack(..., n=n)``): then a decryption shows the key holder only the
``cell_bits`` per sum that honest sums fill, whatever it encrypted; a sum sent alone, for the
key holder to fold, shows all ``n_bits`` of its plaintext (docs/threat-model.md).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from crypto import CryptoError, OverflowRiskError
from crypto._gmp import mpz, powmod
from crypto.paillier import PaillierPublicKey
from crypto.schemes import (PrivateKey, PublicKey, ciphertexts_from_bytes, ciphertexts_to_bytes,
                            public_key_from_n)

BLOCK_CIPHERTEXTS = 4
"""Packed ciphertexts per pool task: ~44 sums at 2048 bits, ~70 ms, small next to task overhead."""

_Block = tuple[bytes, int, int, int, str]
BlockMap = Callable[[Callable[[_Block], bytes], list[_Block]], Iterable[bytes]]
"""``map`` or a process pool's ``map``: runs the packing of each block, results in order."""


@dataclass(frozen=True, slots=True)
class BinSumPacking:
    """``per_ciphertext`` sums of ``cell_bits`` bits each per plaintext, first sum highest."""

    cell_bits: int
    per_ciphertext: int

    @classmethod
    def for_key(cls, cell_bits: int, n_bits: int) -> BinSumPacking:
        """As many sums per ciphertext as fit below ``2**(n_bits - 1)``."""
        if cell_bits < 1:
            raise CryptoError(f"bin sums of {cell_bits} bits")
        packing = cls(cell_bits, (n_bits - 1) // cell_bits)
        packing.check_fits(n_bits)
        return packing

    def check_fits(self, n_bits: int) -> None:
        """Raise if a packed plaintext could reach n."""
        if self.per_ciphertext < 1 or self.per_ciphertext * self.cell_bits > n_bits - 1:
            raise OverflowRiskError(f"{self.per_ciphertext} sums of {self.cell_bits} bits do not "
                                    f"fit a {n_bits}-bit key")

    def n_ciphertexts(self, sums: int) -> int:
        """Packed ciphertexts that carry ``sums`` bin sums."""
        return -(-sums // self.per_ciphertext)

    def pack(self, ciphertexts: Sequence[mpz], nsquare: mpz,
             n: int | PublicKey | None = None) -> list[mpz]:
        """Fold each run of ``per_ciphertext`` ciphertexts into one (the last run may be short).

        ``nsquare`` is the ciphertext modulus (``cipher_modulus``: n^2 for Paillier, n for
        OU). With ``n`` (the public key, or a Paillier key's modulus), the bits of each plaintext above its sums are random
        (:func:`random_above`): the key holder reads the sums as before, and nothing else. An
        honest sum fits its ``cell_bits``; a key holder that encrypted chosen values instead
        of gradients (``2**i`` for row i) would otherwise read the bins of up to ``n_bits``
        rows in the top sum of every plaintext, the whole plaintext in a run of one.
        """
        shift = mpz(1) << self.cell_bits
        out = []
        for start in range(0, len(ciphertexts), self.per_ciphertext):
            run = ciphertexts[start:start + self.per_ciphertext]
            acc = mpz(run[0])
            for c in run[1:]:
                acc = powmod(acc, shift, nsquare) * c % nsquare
            out.append(acc if n is None else random_above(acc, len(run) * self.cell_bits, n))
        return out

    def unpack(self, plaintexts: Sequence[int], sums: int, masked: bool = False) -> list[int]:
        """The ``sums`` bin sums from the decrypted packed plaintexts, in packing order
        (``masked``: packed with random bits above the sums, which are dropped)."""
        if len(plaintexts) != self.n_ciphertexts(sums):
            raise CryptoError(f"{len(plaintexts)} packed plaintexts cannot hold {sums} sums")
        bits, mask = self.cell_bits, (1 << self.cell_bits) - 1
        out: list[int] = []
        for k, packed in enumerate(plaintexts):
            here = min(self.per_ciphertext, sums - k * self.per_ciphertext)
            packed = int(packed)
            if masked:
                packed &= (1 << (here * bits)) - 1
            elif packed >> (here * bits):
                raise OverflowRiskError(f"packed plaintext {k} is wider than its {here} sums")
            out += [(packed >> (i * bits)) & mask for i in reversed(range(here))]
        return out


def random_above(ciphertext: mpz, bits: int, n: int | PublicKey) -> mpz:
    """The ciphertext plus ``r * 2**bits`` for a uniform r that keeps a plaintext below
    ``2**bits`` within the key's plaintexts (below n for Paillier, below p for OU): the low
    ``bits`` bits decrypt as before, the ones above are random. Adding a known plaintext needs
    no obfuscator (``add_plain``): the ciphertext's own randomness covers it."""
    public = n if isinstance(n, PublicKey) else PaillierPublicKey(mpz(n))
    room = ((public.max_plaintext + 1) >> bits) - 1
    if room < 1:  # the sums fill the plaintext: nothing above them to hide
        return mpz(ciphertext)
    return public.add_plain(ciphertext, secrets.randbelow(room) << bits)


def decrypt_bin_sums(private: PrivateKey, ciphertexts: Sequence[mpz],
                     cell_bits: int) -> list[int]:
    """The key holder's side of bin sums sent one per ciphertext: fold as many as stay below p
    and decrypt them modulo p (``PaillierPrivateKey.decrypt_folded``), then cut them apart: the
    very sums that decrypting each ciphertext would give, for far less work."""
    run = private.fold_run(cell_bits)
    if run < 1:
        raise OverflowRiskError(f"bin sums of {cell_bits} bits do not fit below p")
    plain = private.decrypt_folded(ciphertexts, cell_bits, run)
    return BinSumPacking(cell_bits, run).unpack(plain, len(ciphertexts))


def _pack_block(block: _Block) -> bytes:
    """Pool task: pack one block of fixed-width ciphertexts (module level so it pickles)."""
    blob, n, cell_bits, per_ciphertext, scheme = block
    public = public_key_from_n(scheme, n)
    packed = BinSumPacking(cell_bits, per_ciphertext).pack(ciphertexts_from_bytes(blob, public),
                                                           public.cipher_modulus)
    return ciphertexts_to_bytes(packed, public)


def pack_bin_sums(ciphertexts: bytes, public_key: PublicKey, packing: BinSumPacking,
                  map_blocks: BlockMap = map) -> tuple[list[bool], bytes]:
    """Which bins are non-empty, and their sums packed (fixed width), from fixed-width sums.

    Blocks are whole runs of ``per_ciphertext`` sums, so the result does not depend on how
    ``map_blocks`` spreads them over processes.
    """
    packing.check_fits(public_key.plaintext_bits)
    width = public_key.ciphertext_bytes
    if len(ciphertexts) % width:
        raise CryptoError(f"{len(ciphertexts)} bytes of bin sums are not a multiple of {width}")
    empty = (1).to_bytes(width, "big")  # the trivial encryption of 0
    cells = [ciphertexts[k:k + width] for k in range(0, len(ciphertexts), width)]
    filled = [cell != empty for cell in cells]
    sums = [cell for cell, full in zip(cells, filled) if full]
    step = BLOCK_CIPHERTEXTS * packing.per_ciphertext
    blocks = [(b"".join(sums[i:i + step]), int(public_key.n), packing.cell_bits,
               packing.per_ciphertext, public_key.scheme) for i in range(0, len(sums), step)]
    return filled, b"".join(map_blocks(_pack_block, blocks))
