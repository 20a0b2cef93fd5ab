"""Paillier batches on several processes (both cores), ciphertexts crossing as bytes.

The key holder's pool processes receive the private key at start-up from the party's own
worker process (a local pipe on the party's machine, never the wire) and build their own
window tables once. Each batch is cut into one slice per process.

Obfuscators do not depend on the plaintexts, so they are made ahead (``KeyHolderPool.prepare``)
by preparer processes running at the kernel's idle priority (``SCHED_IDLE``; ``nice 19`` where
that is refused): they take only CPU time nothing else on the machine wants, such as the cores
that wait while passive parties build histograms, and never slow the party's own work or a
neighbour's. Their obfuscators come back over a local pipe to the worker process, which hands
each one, once, to the process encrypting the row it hides; an encryption then costs a few
products instead of ~44. Like the key, they never leave the party's machine, and they are
dropped with the pool.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import threading
import weakref
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from multiprocessing.pool import Pool

from crypto._gmp import mpz
from crypto.compress import decrypt_bin_sums
from crypto.paillier import (PaillierPrivateKey, PaillierPublicKey, ciphertexts_from_bytes,
                             ciphertexts_to_bytes)

log = logging.getLogger(__name__)

_KEY: PaillierPrivateKey | None = None

SPARE_BYTES = 256 << 20
"""Memory the worker process may fill with obfuscators made ahead (~500,000 at 2048 bits)."""
PREPARE_BATCH = 256
"""Obfuscators per preparing task."""


def _init(n: int, p: int, q: int, obfuscator: str,
          on_start: Callable[[], None] | None) -> None:
    global _KEY
    if on_start is not None:
        on_start()
    _KEY = PaillierPrivateKey(PaillierPublicKey(mpz(n)), mpz(p), mpz(q), obfuscator)
    _KEY.encrypt_batch([0])  # build the obfuscator tables now, not in the first batch


def _init_preparer(n: int, p: int, q: int, obfuscator: str,
                   on_start: Callable[[], None] | None) -> None:
    try:  # only CPU time nobody else wants
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        os.nice(19)
    _init(n, p, q, obfuscator, on_start)


def _halves(key: PaillierPrivateKey) -> tuple[int, int]:
    """Byte widths of an obfuscator's residues modulo p^2 and q^2."""
    return (key.psquare.bit_length() + 7) // 8, (key.qsquare.bit_length() + 7) // 8


def _make_obfuscators(count: int) -> bytes:
    """``count`` obfuscators as concatenated fixed-width residue pairs (a preparer's task)."""
    assert _KEY is not None
    wp, wq = _halves(_KEY)
    return b"".join(int(rp).to_bytes(wp, "big") + int(rq).to_bytes(wq, "big")
                    for rp, rq in _KEY.obfuscators(count))


def _encrypt(task: tuple[list[int], bytes]) -> bytes:
    assert _KEY is not None  # set by the pool initializer
    plaintexts, spare_blob = task
    wp, wq = _halves(_KEY)
    width = wp + wq
    spare = [(mpz(int.from_bytes(spare_blob[i:i + wp], "big")),
              mpz(int.from_bytes(spare_blob[i + wp:i + width], "big")))
             for i in range(0, len(spare_blob), width)]
    return ciphertexts_to_bytes(_KEY.encrypt_batch(plaintexts, spare), _KEY.public_key)


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


def _terminate(pools: list[Pool]) -> None:
    """Stop a key holder's processes (``KeyHolderPool.close``, or its finalizer). terminate()
    joins the processes itself, and unlike join() it may run on one of the pool's own threads
    (the finalizer does when a result callback drops the last reference)."""
    for pool in reversed(pools):  # the preparers first: they feed the others
        pool.terminate()


class KeyHolderPool:
    """Encrypt and decrypt for the key holder on ``processes`` processes; each runs
    ``on_start`` first (a worker passes ``workers.lifeline.die_with_parent``: the processes
    hold the private key and must not outlive it). As many preparer processes make
    obfuscators ahead when asked (module docstring)."""

    def __init__(self, private: PaillierPrivateKey, processes: int | None = None,
                 on_start: Callable[[], None] | None = None) -> None:
        self.private = private
        self.processes = processes or default_processes()
        initargs = (int(private.public_key.n), int(private.p), int(private.q),
                    private.obfuscator, on_start)
        context = mp.get_context("spawn")
        self._pool = context.Pool(self.processes, initializer=_init, initargs=initargs)
        self._running: list[Pool] = [self._pool]
        # a pool nobody closed is stopped when it is collected or at interpreter exit; left
        # to multiprocessing's own __del__ there, it prints a traceback
        self._stop = weakref.finalize(self, _terminate, self._running)
        self._initargs = initargs
        self._preparers: Pool | None = None  # started with the first prepare()
        wp, wq = _halves(private)
        self._spare_width = wp + wq
        self._spare: deque[bytes] = deque()  # blobs of obfuscators, each handed out once
        self._spare_count = 0
        self._lock = threading.Lock()
        self._to_prepare = 0  # obfuscators still wanted ahead
        self._preparing = 0  # preparing tasks in flight
        self._closed = False
        self.made_ahead = 0
        """Obfuscators made ahead so far."""

    def prepare(self, count: int) -> None:
        """Have about ``count`` obfuscators made ahead, at idle priority (module docstring)."""
        with self._lock:
            if self._closed:
                return
            self._to_prepare = max(0, count - self._spare_count)
            if self._preparers is None and self._to_prepare:
                self._preparers = mp.get_context("spawn").Pool(
                    self.processes, initializer=_init_preparer, initargs=self._initargs)
                self._running.append(self._preparers)
        self._prepare_more()

    def _prepare_more(self) -> None:
        """Keep one preparing task per preparer in flight while obfuscators are wanted and
        there is room for them (called again as each task ends)."""
        cap = SPARE_BYTES // self._spare_width
        while True:
            with self._lock:
                if (self._closed or self._preparers is None or self._to_prepare <= 0
                        or self._preparing >= self.processes
                        or self._spare_count + (self._preparing + 1) * PREPARE_BATCH > cap):
                    return
                batch = min(PREPARE_BATCH, self._to_prepare)
                self._to_prepare -= batch
                self._preparing += 1
                preparers = self._preparers
            try:
                preparers.apply_async(_make_obfuscators, (batch,), callback=self._prepared,
                                      error_callback=self._prepare_failed)
            except ValueError:  # the pool was closed meanwhile
                return

    def _prepared(self, blob: bytes) -> None:
        with self._lock:
            self._preparing -= 1
            if self._closed:
                return
            self._spare.append(blob)
            made = len(blob) // self._spare_width
            self._spare_count += made
            self.made_ahead += made
        self._prepare_more()

    def _prepare_failed(self, exc: BaseException) -> None:
        with self._lock:
            self._preparing -= 1
            self._to_prepare = 0
        log.warning("making obfuscators ahead failed (encryption makes them as it goes): %s", exc)

    def _take_spare(self, count: int) -> bytes:
        """Up to ``count`` obfuscators made ahead, taken out (never handed out twice)."""
        taken: list[bytes] = []
        with self._lock:
            while count > 0 and self._spare:
                blob = self._spare.popleft()
                cut = count * self._spare_width
                if len(blob) > cut:
                    self._spare.appendleft(blob[cut:])
                    blob = blob[:cut]
                taken.append(blob)
                made = len(blob) // self._spare_width
                count -= made
                self._spare_count -= made
        return b"".join(taken)

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
        blobs = self._pool.imap(_encrypt, [(list(plaintexts[a:b]), self._take_spare(b - a))
                                           for a, b in cuts])
        for (_, stop), blob in zip(cuts, blobs, strict=True):
            done.append(blob)
            if stop % chunk == 0 or stop == count:  # a chunk's last part
                yield b"".join(done)
                done = []

    def encrypt_later(self, plaintexts: Sequence[int]) -> Callable[[], bytes]:
        """Start encrypting (split over the processes); the returned call waits for the
        ciphertexts. The caller sends one batch while the next is encrypted."""
        parts = [(list(plaintexts[s]), self._take_spare(s.stop - s.start))
                 for s in self._slices(len(plaintexts))]
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
        """Stop the processes; drop the obfuscators made ahead."""
        with self._lock:
            self._closed = True
            self._spare.clear()
            self._spare_count = 0
            self._preparers = None
        self._stop()
