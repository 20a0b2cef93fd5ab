"""Paillier batches on several processes (both cores), ciphertexts crossing as bytes.

The key holder's pool processes receive the private key at start-up from the party's own
worker process (a local pipe on the party's machine, never the wire) and build their own
window tables once. Each batch is cut into one slice per process.
"""

from __future__ import annotations

import multiprocessing as mp
import os
from collections.abc import Callable, Iterator, Sequence

from crypto._gmp import mpz
from crypto.compress import decrypt_bin_sums
from crypto.paillier import (PaillierPrivateKey, PaillierPublicKey, ciphertexts_from_bytes,
                             ciphertexts_to_bytes)

_KEY: PaillierPrivateKey | None = None


def _init(n: int, p: int, q: int, obfuscator: str,
          on_start: Callable[[], None] | None) -> None:
    global _KEY
    if on_start is not None:
        on_start()
    _KEY = PaillierPrivateKey(PaillierPublicKey(mpz(n)), mpz(p), mpz(q), obfuscator)
    _KEY.encrypt_batch([0])  # build the obfuscator tables now, not in the first batch


def _encrypt(plaintexts: list[int]) -> bytes:
    assert _KEY is not None  # set by the pool initializer
    return ciphertexts_to_bytes(_KEY.encrypt_batch(plaintexts), _KEY.public_key)


def _decrypt(blob: bytes) -> list[int]:
    assert _KEY is not None
    return [int(m) for m in _KEY.decrypt_batch(ciphertexts_from_bytes(blob, _KEY.public_key))]


def _decrypt_sums(task: tuple[bytes, int]) -> list[int]:
    assert _KEY is not None
    blob, cell_bits = task
    return decrypt_bin_sums(_KEY, ciphertexts_from_bytes(blob, _KEY.public_key), cell_bits)


def default_processes() -> int:
    """One process per core."""
    return max(1, os.cpu_count() or 1)


class KeyHolderPool:
    """Encrypt and decrypt for the key holder on ``processes`` processes; each runs
    ``on_start`` first (a worker passes ``workers.lifeline.die_with_parent``: the processes
    hold the private key and must not outlive it)."""

    def __init__(self, private: PaillierPrivateKey, processes: int | None = None,
                 on_start: Callable[[], None] | None = None) -> None:
        self.private = private
        self.processes = processes or default_processes()
        self._pool = mp.get_context("spawn").Pool(
            self.processes, initializer=_init,
            initargs=(int(private.public_key.n), int(private.p), int(private.q),
                      private.obfuscator, on_start))

    def _slices(self, count: int) -> list[slice]:
        step = -(-count // self.processes) if count else 1
        return [slice(i, min(i + step, count)) for i in range(0, count, step)]

    def encrypt(self, plaintexts: Sequence[int]) -> bytes:
        """Encrypt to concatenated fixed-width ciphertexts (one chunk, split over the processes)."""
        return b"".join(self.encrypt_chunks(plaintexts, max(1, len(plaintexts))))

    def encrypt_chunks(self, plaintexts: Sequence[int], chunk: int) -> Iterator[bytes]:
        """Encrypt ``chunk`` plaintexts at a time (the last chunk may be shorter), each chunk
        split over the processes, and yield each chunk's ciphertexts as soon as it is done, in
        order, so the caller can send one while the next is encrypted."""
        if chunk < 1:
            raise ValueError(f"chunks of {chunk} plaintexts")
        count, part = len(plaintexts), -(-chunk // self.processes)
        cuts = [(a, min(a + part, first + chunk, count))
                for first in range(0, count, chunk)
                for a in range(first, min(first + chunk, count), part)]
        done: list[bytes] = []
        blobs = self._pool.imap(_encrypt, [list(plaintexts[a:b]) for a, b in cuts])
        for (_, stop), blob in zip(cuts, blobs, strict=True):
            done.append(blob)
            if stop % chunk == 0 or stop == count:  # a chunk's last part
                yield b"".join(done)
                done = []

    def encrypt_later(self, plaintexts: Sequence[int]) -> Callable[[], bytes]:
        """Start encrypting (split over the processes); the returned call waits for the
        ciphertexts. The caller sends one batch while the next is encrypted."""
        parts = [list(plaintexts[s]) for s in self._slices(len(plaintexts))]
        pending = self._pool.map_async(_encrypt, parts)
        return lambda: b"".join(pending.get())

    def decrypt(self, ciphertexts: bytes) -> list[int]:
        """Decrypt concatenated fixed-width ciphertexts."""
        width = self.private.public_key.ciphertext_bytes
        count = len(ciphertexts) // width
        parts = [ciphertexts[s.start * width:s.stop * width] for s in self._slices(count)]
        return [m for part in self._pool.map(_decrypt, parts) for m in part]

    def decrypt_sums(self, ciphertexts: bytes, cell_bits: int) -> list[int]:
        """Bin sums of ``cell_bits`` bits sent one per concatenated ciphertext, folded and
        decrypted (``crypto.compress.decrypt_bin_sums``) on the processes, in order."""
        width = self.private.public_key.ciphertext_bytes
        count = len(ciphertexts) // width
        if not count:
            return []
        run = max(1, self.private.fold_run(cell_bits))  # below 1, the processes say why
        runs = -(-count // run)
        per_process = -(-runs // self.processes) * run  # whole runs: folds do not depend on it
        tasks = [(ciphertexts[a * width:min(a + per_process, count) * width], cell_bits)
                 for a in range(0, count, per_process)]
        return [m for part in self._pool.map(_decrypt_sums, tasks) for m in part]

    def close(self) -> None:
        """Stop the processes."""
        self._pool.terminate()
        self._pool.join()
