"""The one seam to the additively homomorphic schemes: Paillier (default) and Okamoto-Uchiyama.

Both schemes' keys have one interface (``crypto.paillier`` and ``crypto.ou``): ``raw_encrypt``,
``add``, ``add_plain``, ``scalar_mul``, ``check_ciphertext``, ``cipher_modulus``,
``ciphertext_bytes``, ``plaintext_bits`` and ``n_bytes`` on the public key; ``encrypt_batch``
with obfuscators made ahead (``obfuscators``, residues modulo ``obfuscator_moduli``),
``raw_decrypt``, ``decrypt_folded`` and ``fold_run`` on the private key. A public key travels as
its modulus ``n`` (OU derives ``g`` and ``h`` from it); which scheme it belongs to is the job's
``crypto.scheme``, never guessed from the bytes.
"""

from __future__ import annotations

from crypto import CryptoError
from crypto import ou, paillier

PublicKey = paillier.PaillierPublicKey | ou.OUPublicKey
PrivateKey = paillier.PaillierPrivateKey | ou.OUPrivateKey

SCHEMES = ("paillier", "ou")
"""Paillier first: the default."""

DEFAULT_SCHEME = "paillier"


def _check(scheme: str) -> str:
    if scheme not in SCHEMES:
        raise CryptoError(f"encryption scheme {scheme!r} is not one of {SCHEMES}")
    return scheme


def generate_keypair(scheme: str, n_bits: int, obfuscator: str = "short"
                     ) -> tuple[PublicKey, PrivateKey]:
    """A fresh key pair of ``scheme`` whose modulus has ``n_bits`` bits."""
    if _check(scheme) == "ou":
        return ou.generate_keypair(n_bits, obfuscator)
    return paillier.generate_keypair(n_bits, obfuscator)


def public_key_from_n(scheme: str, n: int, expected_bits: int | None = None) -> PublicKey:
    """A received public key of ``scheme`` from its modulus, checking its size."""
    if _check(scheme) == "ou":
        return ou.public_key_from_n(n, expected_bits)
    return paillier.public_key_from_n(n, expected_bits)


def private_key_from_factors(scheme: str, n: int, p: int, q: int,
                             obfuscator: str = "short") -> PrivateKey:
    """The key holder's private key rebuilt from its factors (its own processes only)."""
    if _check(scheme) == "ou":
        return ou.OUPrivateKey(ou.OUPublicKey(n), p, q, obfuscator)
    return paillier.PaillierPrivateKey(paillier.PaillierPublicKey(n), p, q, obfuscator)


ciphertexts_to_bytes = paillier.ciphertexts_to_bytes
ciphertexts_from_bytes = paillier.ciphertexts_from_bytes
