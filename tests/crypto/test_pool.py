"""The key holder's process pool: same results as the single-process key, bytes in and out."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from crypto import CryptoError
from crypto.schemes import ciphertexts_from_bytes, ciphertexts_to_bytes
from crypto.pool import KeyHolderPool

REPO = Path(__file__).resolve().parents[2]


def test_pool_encrypts_and_decrypts_like_the_key(scheme_keypair) -> None:  # type: ignore[no-untyped-def]
    pub, priv = scheme_keypair
    pool = KeyHolderPool(priv, processes=2)
    try:
        plain = list(range(1000, 1101))
        blob = pool.encrypt(plain)
        cts = ciphertexts_from_bytes(blob, pub)
        assert len(cts) == len(plain) and len(set(cts)) == len(plain)
        assert [int(m) for m in priv.decrypt_batch(cts)] == plain
        assert pool.decrypt(ciphertexts_to_bytes(priv.encrypt_batch(plain), pub)) == plain
        assert pool.encrypt([]) == b"" and pool.decrypt(b"") == []
        with pytest.raises(CryptoError):
            pool.decrypt(b"\xff" * pub.ciphertext_bytes)
    finally:
        pool.close()


@pytest.mark.parametrize("count", [0, 1, 5, 6, 7, 13])
def test_pool_folds_and_decrypts_bin_sums_like_the_key(scheme_keypair, count: int) -> None:  # type: ignore[no-untyped-def]
    pub, priv = scheme_keypair
    sums = [(k * 7919) % (1 << 150) for k in range(count)]  # runs of 3 (2 for OU) below p
    blob = ciphertexts_to_bytes(priv.encrypt_batch(sums), pub)
    pool = KeyHolderPool(priv, processes=2)
    try:
        assert priv.fold_run(150) == (3 if pub.scheme == "paillier" else 2)
        assert pool.decrypt_sums(blob, 150) == sums
    finally:
        pool.close()


@pytest.mark.parametrize("count", [0, 1, 7, 8, 9, 23])
def test_chunks_come_in_order_and_whole(scheme_keypair, count: int) -> None:  # type: ignore[no-untyped-def]
    pub, priv = scheme_keypair
    pool = KeyHolderPool(priv, processes=2)
    try:
        plain = list(range(5000, 5000 + count))
        chunks = list(pool.encrypt_chunks(plain, 8))
        assert [len(c) // pub.ciphertext_bytes for c in chunks] == \
            [min(8, count - k) for k in range(0, count, 8)]
        cts = ciphertexts_from_bytes(b"".join(chunks), pub)
        assert [int(m) for m in priv.decrypt_batch(cts)] == plain
    finally:
        pool.close()


def test_pool_with_the_full_obfuscator(keypair_1024) -> None:  # type: ignore[no-untyped-def]
    from crypto.paillier import PaillierPrivateKey

    pub, short = keypair_1024
    pool = KeyHolderPool(PaillierPrivateKey(pub, short.p, short.q, "full"), processes=2)
    try:
        plain = list(range(40))
        cts = ciphertexts_from_bytes(pool.encrypt(plain), pub)
        assert len(set(cts)) == 40 and [int(m) for m in short.decrypt_batch(cts)] == plain
    finally:
        pool.close()


def test_obfuscators_made_ahead_are_each_used_once(keypair_1024) -> None:  # type: ignore[no-untyped-def]
    pub, priv = keypair_1024
    spare = priv.obfuscators(5)
    cts = priv.encrypt_batch([7] * 8, spare)  # 5 made ahead, then 3 fresh
    assert spare == [] and len(set(cts)) == 8
    assert [int(m) for m in priv.decrypt_batch(cts)] == [7] * 8


@pytest.mark.parametrize("obfuscator", ["short", "full"])
def test_pool_encrypts_with_obfuscators_made_ahead(scheme_keypair, obfuscator: str) -> None:  # type: ignore[no-untyped-def]
    import time

    from crypto import pool as pool_module
    from crypto.schemes import private_key_from_factors

    pub, short = scheme_keypair
    # at normal priority: idle preparers make nothing while every core is busy (tests on a
    # loaded machine), and this test is about the hand-off (test_key_holder_under_load: idle)
    pool = KeyHolderPool(private_key_from_factors(pub.scheme, pub.n, short.p, short.q,
                                                  obfuscator), processes=2, idle_preparers=False)
    try:
        pool.prepare(3 * pool_module.PREPARE_BATCH)
        deadline = time.monotonic() + 120
        while pool.made_ahead < 3 * pool_module.PREPARE_BATCH and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pool.made_ahead == 3 * pool_module.PREPARE_BATCH and pool._preparing == 0
        plain = [7] * (4 * pool_module.PREPARE_BATCH)  # more than were made ahead
        cts = ciphertexts_from_bytes(pool.encrypt(plain), pub)
        assert pool._spare_count == 0 and not pool._spare  # every one handed out, once
        assert len(set(cts)) == len(plain)  # no obfuscator served twice
        assert [int(m) for m in short.decrypt_batch(cts)] == plain
        pool.prepare(2 * pool_module.PREPARE_BATCH)
        chunks = list(pool.encrypt_chunks([9] * 100, 30))  # spare or not, while it is made
        assert [int(m) for m in short.decrypt_batch(
            ciphertexts_from_bytes(b"".join(chunks), pub))] == [9] * 100
    finally:
        pool.close()


def _leave_a_pool_running() -> None:
    """A worker process that ends with a job's pool still open (a job that failed elsewhere)."""
    from crypto.paillier import generate_keypair

    _, private = generate_keypair(1024)
    pool = KeyHolderPool(private, 1)
    pool.prepare(2000)
    pool.encrypt([1, 2, 3])


def test_a_pool_nobody_closed_stops_quietly_with_its_process() -> None:
    """A process that ends without closing its pool must not print multiprocessing's
    traceback on the way out (it reached users' terminals through a failed job)."""
    code = ("import multiprocessing as mp\n"
            "from tests.crypto.test_pool import _leave_a_pool_running\n"
            "p = mp.get_context('spawn').Process(target=_leave_a_pool_running)\n"
            "p.start(); p.join(); raise SystemExit(p.exitcode)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=120, env={"PYTHONPATH": str(REPO), "PATH": ""})
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr, done.stderr


def test_a_pool_dropped_while_it_prepares_stops_from_its_own_thread(keypair_1024) -> None:  # type: ignore[no-untyped-def]
    """The last reference to a preparing pool may go in its own result thread (the callback
    of a preparing task): stopping it there must work too."""
    import gc
    import time

    _, private = keypair_1024
    failures: list[object] = []
    hook, sys.unraisablehook = sys.unraisablehook, failures.append
    try:
        pool = KeyHolderPool(private, 1)
        pool.prepare(1500)
        stopped = pool._stop
        del pool
        gc.collect()
        deadline = time.monotonic() + 60
        while stopped.alive and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not stopped.alive, "the pool was never stopped"
    finally:
        sys.unraisablehook = hook
    assert not failures, [getattr(f, "exc_value", f) for f in failures]
