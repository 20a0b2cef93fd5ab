"""Paillier or OU batches on several processes (both cores), ciphertexts crossing as bytes.

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

A process at idle priority may not run for minutes on a busy machine, so the worker process
never waits for one (issue 28: ``multiprocessing.Pool.terminate`` waited 900 s for its result
queue's lock, held by a preparer that never got the CPU back). Each preparer has a pipe of its
own, with one writer at each end: nothing is locked between processes. The worker process
reads the pipes on a thread of its own, and closing kills the preparers (their obfuscators are
disposable) and waits for none of them longer than ``STOP_SECONDS``.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import threading
import time
import typing
import weakref
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from multiprocessing.connection import Connection, wait
from multiprocessing.pool import Pool
from multiprocessing.process import BaseProcess

from crypto._gmp import mpz
from crypto.compress import decrypt_bin_sums
from crypto.schemes import (PrivateKey, ciphertexts_from_bytes, ciphertexts_to_bytes,
                            private_key_from_factors)

log = logging.getLogger(__name__)

_KEY: PrivateKey | None = None

SPARE_BYTES = 256 << 20
"""Memory the worker process may fill with obfuscators made ahead (~500,000 at 2048 bits)."""
PREPARE_BATCH = 256
"""Obfuscators per preparing task."""
STOP_SECONDS = 1.0
"""How long closing waits, in all, for killed preparers to be gone; one still there later (not
given the CPU yet to die) is reaped by multiprocessing when it is."""
READ_SECONDS = 0.5
"""How often the thread reading the preparers' pipes looks whether the pool was closed."""


def _init(scheme: str, n: int, p: int, q: int, obfuscator: str,
          on_start: Callable[[], None] | None) -> None:
    global _KEY
    if on_start is not None:
        on_start()
    _KEY = private_key_from_factors(scheme, mpz(n), mpz(p), mpz(q), obfuscator)
    _KEY.encrypt_batch([0])  # build the obfuscator tables now, not in the first batch


def _init_preparer(idle: bool, scheme: str, n: int, p: int, q: int, obfuscator: str,
                   on_start: Callable[[], None] | None) -> None:
    if idle:  # only CPU time nobody else wants
        try:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        except (AttributeError, OSError):
            os.nice(19)
    _init(scheme, n, p, q, obfuscator, on_start)


def _serve_obfuscators(pipe: Connection, idle: bool, scheme: str, n: int, p: int, q: int,
                       obfuscator: str, on_start: Callable[[], None] | None) -> None:
    """A preparer: at idle priority, answer each request on its own pipe (a count) with that
    many obfuscators, until asked for none or the pipe closes."""
    _init_preparer(idle, scheme, n, p, q, obfuscator, on_start)
    while True:
        try:
            count = int.from_bytes(pipe.recv_bytes(), "big")
            if not count:
                return
            pipe.send_bytes(_make_obfuscators(count))
        except (EOFError, OSError):  # the worker process closed the pool
            return


def _halves(key: PrivateKey) -> tuple[int, int]:
    """Byte widths of an obfuscator's two residues (modulo p^2 and q^2; p^2 and q for OU)."""
    mp, mq = key.obfuscator_moduli
    return (mp.bit_length() + 7) // 8, (mq.bit_length() + 7) // 8


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


class _Preparers:
    """The preparer processes, each with a pipe of its own (module docstring): requests go out
    from whichever thread asks, the obfuscators come in on one reading thread, which hands
    them to the pool (held weakly: an unclosed pool is still collected and stopped)."""

    def __init__(self, owner: KeyHolderPool, processes: int, initargs: tuple[object, ...],
                 idle: bool = True) -> None:
        self._owner = weakref.ref(owner)
        self._lock = threading.Lock()  # this process's threads only: no preparer can hold it
        self._pipes: dict[Connection, BaseProcess] = {}
        self._idle: list[Connection] = []  # pipes with no request in flight
        self._stopping = False
        context = mp.get_context("spawn")
        for _ in range(processes):
            ours, theirs = context.Pipe()
            process = context.Process(target=_serve_obfuscators,
                                      args=(theirs, idle, *initargs),
                                      name="obfuscator-preparer", daemon=True)
            process.start()
            theirs.close()
            self._pipes[ours] = process
            self._idle.append(ours)
        self._reader = threading.Thread(target=self._read, name="obfuscators-made-ahead",
                                        daemon=True)
        self._reader.start()

    def request(self, count: int) -> bool:
        """Ask an idle preparer for ``count`` obfuscators; False if none is idle."""
        with self._lock:
            if self._stopping or not self._idle:
                return False
            pipe = self._idle.pop()
            try:  # a few bytes into a pipe holding no other request: never waits
                pipe.send_bytes(count.to_bytes(8, "big"))
            except OSError:  # that preparer is gone; the reading thread says so
                self._idle.append(pipe)
                return False
        return True

    def _read(self) -> None:
        """Take in each preparer's obfuscators as they come; only this thread ever waits on a
        preparer, and only until the pool is closed or that preparer is gone."""
        while True:
            with self._lock:
                if self._stopping or not self._pipes:
                    break
                pipes = list(self._pipes)
            for pipe in typing.cast(list[Connection], wait(pipes, READ_SECONDS)):
                try:
                    blob = pipe.recv_bytes()
                except (EOFError, OSError):
                    self._lose(pipe)
                    continue
                with self._lock:
                    self._idle.append(pipe)
                owner = self._owner()
                if owner is not None:
                    owner._prepared(blob)
                del owner  # the last reference may go here: terminate() allows for it
        with self._lock:
            for pipe in self._pipes:
                pipe.close()
            self._pipes.clear()
            self._idle.clear()

    def _lose(self, pipe: Connection) -> None:
        """A preparer died before the pool was closed (its traceback went to stderr)."""
        with self._lock:
            process = self._pipes.pop(pipe, None)
            busy = pipe not in self._idle
            if not busy:
                self._idle.remove(pipe)
            pipe.close()
            if self._stopping or process is None:
                return
        process.join(STOP_SECONDS)
        owner = self._owner()
        if owner is not None:
            owner._preparer_lost(busy, process.exitcode)

    def terminate(self) -> None:
        """Kill the preparers and wait at most ``STOP_SECONDS`` for them to be gone. SIGKILL:
        what they were making is disposable, and a graceful stop would wait for a process
        that may get no CPU."""
        with self._lock:
            self._stopping = True
            processes = list(self._pipes.values())
        for process in processes:
            process.kill()
        deadline = time.monotonic() + STOP_SECONDS
        for process in processes:
            process.join(max(0.0, deadline - time.monotonic()))
        if threading.current_thread() is not self._reader:
            self._reader.join(max(0.0, deadline - time.monotonic()))


def _terminate(running: list[Pool | _Preparers]) -> None:
    """Stop a key holder's processes (``KeyHolderPool.close``, or its finalizer). Both kinds
    of terminate() may run on a thread of their own (the finalizer does when a result
    callback drops the last reference). Pool.terminate() waits on the pool's locks, which only
    processes at the worker's own priority hold."""
    for pool in reversed(running):  # the preparers first: they feed the others
        pool.terminate()


class KeyHolderPool:
    """Encrypt and decrypt for the key holder on ``processes`` processes; each runs
    ``on_start`` first (a worker passes ``workers.lifeline.die_with_parent``: the processes
    hold the private key and must not outlive it). As many preparer processes make
    obfuscators ahead when asked (module docstring)."""

    def __init__(self, private: PrivateKey, processes: int | None = None,
                 on_start: Callable[[], None] | None = None, idle_preparers: bool = True) -> None:
        self.private = private
        self.idle_preparers = idle_preparers
        """Preparers at idle priority (always, in a worker); tests of the hand-off turn it off,
        since on a machine whose cores are all busy idle preparers make nothing."""
        self.processes = processes or default_processes()
        initargs = (private.public_key.scheme, int(private.public_key.n), int(private.p),
                    int(private.q),
                    private.obfuscator, on_start)
        context = mp.get_context("spawn")
        self._pool = context.Pool(self.processes, initializer=_init, initargs=initargs)
        self._running: list[Pool | _Preparers] = [self._pool]
        # a pool nobody closed is stopped when it is collected or at interpreter exit; left
        # to multiprocessing's own __del__ there, it prints a traceback
        self._stop = weakref.finalize(self, _terminate, self._running)
        self._initargs = initargs
        self._preparers: _Preparers | None = None  # started with the first prepare()
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
                self._preparers = _Preparers(self, self.processes, self._initargs,
                                             self.idle_preparers)
                self._running.append(self._preparers)
        self._prepare_more()

    def _prepare_more(self) -> None:
        """Keep one preparing task per preparer in flight while obfuscators are wanted and
        there is room for them (called again as each task ends)."""
        cap = SPARE_BYTES // self._spare_width
        while True:
            with self._lock:
                if (self._closed or self._preparers is None or self._to_prepare <= 0
                        or self._spare_count + (self._preparing + 1) * PREPARE_BATCH > cap):
                    return
                batch = min(PREPARE_BATCH, self._to_prepare)
                if not self._preparers.request(batch):  # each preparer has one in flight
                    return
                self._to_prepare -= batch
                self._preparing += 1

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

    def _preparer_lost(self, busy: bool, exitcode: int | None) -> None:
        with self._lock:
            if busy:
                self._preparing -= 1
        log.warning("a process making obfuscators ahead stopped (exit code %s); encryption makes "
                    "the ones it lacks as it goes", exitcode)

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
