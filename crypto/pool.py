"""Paillier batches on several processes (both cores), ciphertexts crossing as bytes.

The key holder's pool processes receive the private key at start-up from the party's own
worker process (a local pipe on the party's machine, never the wire) and build their own
window tables once. Each batch is cut into one slice per process.

Obfuscators do not depend on the plaintexts, so the processes make them ahead while they would
otherwise wait (``KeyHolderPool.prepare``: while passive parties build histograms)
and keep them, like the key, in their own memory; an encryption then costs a few products
instead of ~44. Preparing goes one small batch per process at a time and pauses for real work,
which waits for one batch at most.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import threading
from collections.abc import Callable, Iterator, Sequence

from crypto._gmp import mpz
from crypto.compress import decrypt_bin_sums
from crypto.paillier import (PaillierPrivateKey, PaillierPublicKey, ciphertexts_from_bytes,
                             ciphertexts_to_bytes)

log = logging.getLogger(__name__)

_KEY: PaillierPrivateKey | None = None
_SPARE: list[tuple[mpz, mpz]] = []
"""This process's obfuscators made ahead (each used once, then dropped)."""

SPARE_BYTES = 128 << 20
"""Memory each crypto process may fill with obfuscators made ahead (~220,000 at 2048 bits)."""
PREPARE_BATCH = 128
"""Obfuscators per preparing task: real work waits for at most one (~15 ms at 2048 bits)."""


def _init(n: int, p: int, q: int, obfuscator: str,
          on_start: Callable[[], None] | None) -> None:
    global _KEY
    if on_start is not None:
        on_start()
    _KEY = PaillierPrivateKey(PaillierPublicKey(mpz(n)), mpz(p), mpz(q), obfuscator)
    _KEY.encrypt_batch([0])  # build the obfuscator tables now, not in the first batch


def _encrypt(plaintexts: list[int]) -> bytes:
    assert _KEY is not None  # set by the pool initializer
    return ciphertexts_to_bytes(_KEY.encrypt_batch(plaintexts, _SPARE), _KEY.public_key)


def _prepare(count: int) -> int:
    """Make up to ``count`` obfuscators ahead, within ``SPARE_BYTES``; how many were made."""
    assert _KEY is not None
    room = SPARE_BYTES // (_KEY.public_key.ciphertext_bytes + 64) - len(_SPARE)
    made = max(0, min(count, room))
    _SPARE.extend(_KEY.obfuscators(made))
    return made


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
        self._lock = threading.Lock()
        self._to_prepare = 0  # obfuscators still wanted ahead
        self._preparing = 0  # preparing tasks in flight
        self._busy = 0  # real work in progress: preparing pauses
        self._closed = False
        self.made_ahead = 0
        """Obfuscators the processes have made ahead so far."""

    def prepare(self, count: int) -> None:
        """Make about ``count`` obfuscators ahead, in the background (module docstring)."""
        with self._lock:
            self._to_prepare = max(0, count)
        self._prepare_more()

    def _prepare_more(self) -> None:
        """Keep one preparing task per process in flight while obfuscators are wanted and no
        real work runs (called again as each task ends)."""
        while True:
            with self._lock:
                if (self._closed or self._busy or self._to_prepare <= 0
                        or self._preparing >= self.processes):
                    return
                batch = min(PREPARE_BATCH, self._to_prepare)
                self._to_prepare -= batch
                self._preparing += 1
            try:
                self._pool.apply_async(_prepare, (batch,), callback=self._prepared,
                                       error_callback=self._prepare_failed)
            except ValueError:  # the pool was closed meanwhile
                return

    def _prepared(self, made: int) -> None:
        with self._lock:
            self._preparing -= 1
            self.made_ahead += made
            if made == 0:  # that process is full: stop rather than spin
                self._to_prepare = 0
        self._prepare_more()

    def _prepare_failed(self, exc: BaseException) -> None:
        with self._lock:
            self._preparing -= 1
            self._to_prepare = 0
        log.warning("making obfuscators ahead failed (encryption makes them as it goes): %s", exc)

    def _work(self) -> None:
        """Real work starts: preparing pauses (tasks in flight finish)."""
        with self._lock:
            self._busy += 1

    def _done(self) -> None:
        with self._lock:
            self._busy -= 1
        self._prepare_more()

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
        self._work()
        try:
            blobs = self._pool.imap(_encrypt, [list(plaintexts[a:b]) for a, b in cuts])
            for (_, stop), blob in zip(cuts, blobs, strict=True):
                done.append(blob)
                if stop % chunk == 0 or stop == count:  # a chunk's last part
                    yield b"".join(done)
                    done = []
        finally:
            self._done()

    def encrypt_later(self, plaintexts: Sequence[int]) -> Callable[[], bytes]:
        """Start encrypting (split over the processes); the returned call waits for the
        ciphertexts. The caller sends one batch while the next is encrypted."""
        parts = [list(plaintexts[s]) for s in self._slices(len(plaintexts))]
        self._work()  # done when the batch is, whether or not the caller waits for it
        pending = self._pool.map_async(_encrypt, parts, callback=lambda _: self._done(),
                                       error_callback=lambda _: self._done())
        return lambda: b"".join(pending.get())

    def decrypt(self, ciphertexts: bytes) -> list[int]:
        """Decrypt concatenated fixed-width ciphertexts."""
        width = self.private.public_key.ciphertext_bytes
        count = len(ciphertexts) // width
        parts = [ciphertexts[s.start * width:s.stop * width] for s in self._slices(count)]
        self._work()
        try:
            return [m for part in self._pool.map(_decrypt, parts) for m in part]
        finally:
            self._done()

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
        self._work()
        try:
            return [m for part in self._pool.map(_decrypt_sums, tasks) for m in part]
        finally:
            self._done()

    def close(self) -> None:
        """Stop the processes (and with them the obfuscators they made ahead)."""
        with self._lock:
            self._closed = True
        self._pool.terminate()
        self._pool.join()
