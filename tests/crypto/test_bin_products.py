"""The C bin-products kernel (crypto._bin_products) against the gmpy2 loop: the same numbers for
any rows, codes and odd modulus, real ciphertexts' sums decrypting to the plain sums, bad input
refused with a clear error, and the interpreter's lock released while it multiplies (a
worker's connection threads keep running beside a level's histograms)."""

from __future__ import annotations

import os
import secrets
import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crypto import bin_products as kernel_module
from crypto._gmp import mpz
from crypto.bin_products import bin_products
from crypto.schemes import generate_keypair

pytestmark = pytest.mark.skipif(
    not kernel_module._bin_products and os.environ.get("CI") != "true",
    reason="the C kernel is not built here (no compiler or GMP headers)")


def test_ci_builds_the_c_kernel() -> None:
    # CI installs with GMP's headers: the kernel the benchmarks measure is the one tested
    assert kernel_module._bin_products is not None, kernel_module.kernel()
    assert kernel_module.kernel().startswith("c ")


@st.composite
def histograms(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, list[mpz], int, mpz]:
    limbs = draw(st.integers(1, 5))
    modulus = mpz(draw(st.integers(3, 2 ** (64 * limbs) - 1)) | 1)
    n_cts = draw(st.integers(1, 20))
    cts = [mpz(draw(st.integers(1, int(modulus) - 1))) for _ in range(n_cts)]
    n_rows, n_features = draw(st.integers(0, 40)), draw(st.integers(1, 4))
    n_bins = draw(st.integers(1, 6))
    rows = np.array(draw(st.lists(st.integers(0, n_cts - 1), min_size=n_rows,
                                  max_size=n_rows)), dtype=np.int64)
    codes = np.array(draw(st.lists(st.integers(0, n_bins - 1), min_size=n_rows * n_features,
                                   max_size=n_rows * n_features)),
                     dtype=np.uint8).reshape(n_rows, n_features)
    return codes, rows, cts, n_bins, modulus


@settings(max_examples=300, deadline=None)
@given(histograms())
def test_the_c_kernel_equals_the_gmpy2_loop(case: tuple) -> None:
    codes, rows, cts, n_bins, modulus = case
    assert bin_products(*case, native=True) == bin_products(*case, native=False)
    # repeated rows and single-row bins included; a modulus of one limb (a 64-bit R) too
    assert len(bin_products(*case, native=True)) == codes.shape[1] * n_bins


@pytest.mark.parametrize("scheme", ["paillier", "ou"])
def test_sums_of_real_ciphertexts_decrypt_to_the_plain_sums(scheme: str) -> None:
    public, private = generate_keypair(scheme, 1024)
    rng = np.random.default_rng(7)
    values = rng.integers(0, 2 ** 40, size=300).tolist()
    cts = private.encrypt_batch(values)
    codes = rng.integers(0, 8, size=(300, 3), dtype=np.uint8)
    rows = rng.permutation(300)[:250]  # a node's rows, in any order
    sums = bin_products(codes[rows], rows, cts, 8, public.cipher_modulus, native=True)
    for feature in range(3):
        for b in range(8):
            plain = sum(values[r] for r, code in zip(rows, codes[rows][:, feature]) if code == b)
            assert private.raw_decrypt(sums[feature * 8 + b]) == plain


def _case(rows: int = 4) -> tuple[np.ndarray, np.ndarray, list[mpz], int, mpz]:
    modulus = mpz(2 ** 127 - 1)
    cts = [mpz(secrets.randbelow(2 ** 126) + 1) for _ in range(rows)]
    return np.zeros((rows, 2), dtype=np.uint8), np.arange(rows), cts, 4, modulus


@pytest.mark.parametrize("spoil, error, message", [
    (lambda c: c[2].__setitem__(1, 7), TypeError, "gmpy2.mpz, not int"),
    (lambda c: c[2].__setitem__(1, mpz(2 ** 127 - 1)), ValueError, "not in (0, modulus)"),
    (lambda c: c[2].__setitem__(1, mpz(0)), ValueError, "not in (0, modulus)"),
    (lambda c: c[0].__setitem__((1, 1), 4), ValueError, "bin code 4 is not below 4"),
    (lambda c: c[1].__setitem__(3, 9), IndexError, "row 9 is not one of the 4"),
])
def test_bad_input_is_refused_with_a_clear_error(spoil, error, message) -> None:  # type: ignore[no-untyped-def]
    codes, rows, cts, n_bins, modulus = _case()
    case = [codes, rows, cts, n_bins, modulus]
    spoil(case)
    with pytest.raises(error, match=message.replace("(", r"\(").replace(")", r"\)")):
        bin_products(*case, native=True)


def test_an_even_modulus_is_refused() -> None:
    codes, rows, cts, n_bins, _ = _case()
    with pytest.raises(ValueError, match="must be odd"):
        bin_products(codes, rows, cts, n_bins, mpz(2 ** 128), native=True)


def test_other_threads_run_while_it_multiplies() -> None:
    public, _ = generate_keypair("ou", 2048)
    modulus = public.cipher_modulus
    cts = [mpz(secrets.randbelow(int(modulus) - 1) + 1) for _ in range(1000)]
    rows = np.tile(np.arange(1000), 100)  # ~100,000 products: a few tenths of a second
    codes = np.zeros((rows.size, 1), dtype=np.uint8)
    ticks, stop = [], threading.Event()

    def tick() -> None:
        while not stop.is_set():
            ticks.append(time.perf_counter())
            time.sleep(0.001)

    ticker = threading.Thread(target=tick)
    ticker.start()
    time.sleep(0.05)
    started = time.perf_counter()
    bin_products(codes, rows, cts, 1, modulus, native=True)
    took = time.perf_counter() - started
    stop.set()
    ticker.join()
    during = [t for t in ticks if started < t < started + took]
    # with the lock held the whole call, the other thread would not tick at all
    assert took > 0.05 and len(during) >= took / 0.01, (took, len(during))


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 4), st.integers(1, 6),
       st.lists(st.integers(0, 2 ** 70), min_size=0, max_size=12), st.data())
def test_window_powers_in_c_equal_the_gmpy2_loop(limbs: int, window_bits: int,
                                                  exponents: list[int],
                                                  data: st.DataObject) -> None:
    from crypto.bin_products import window_powers
    from crypto.paillier import _FixedBaseTable

    modulus = mpz(data.draw(st.integers(3, 2 ** (64 * limbs) - 1)) | 1)
    base = mpz(data.draw(st.integers(2, int(modulus) - 1))) if modulus > 3 else mpz(2)
    table = _FixedBaseTable(base, modulus, window_bits, exponent_bits=0)
    table._grow(-(-71 // window_bits))  # exponents up to 2^70: 71 bits
    # a base sharing a factor with the modulus can reach 0: such entries are refused in C
    if any(x == 0 for row in table.rows for x in row):
        return
    native = window_powers(table.rows, exponents, window_bits, modulus, native=True)
    assert native == window_powers(table.rows, exponents, window_bits, modulus, native=False)
    assert native == [pow(base, e, modulus) for e in exponents]


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("scheme", ["paillier", "ou"])
def test_encryptions_decrypt_whichever_kernel_raises_the_fixed_bases(  # type: ignore[no-untyped-def]
        scheme: str, native: bool, monkeypatch) -> None:
    """Obfuscators (both schemes) and OU's g^m come from window tables in C or in the loop."""
    monkeypatch.setattr(kernel_module, "NATIVE", native)
    public, private = generate_keypair(scheme, 1024)
    values = [0, 1, 2 ** 100 + 7] + [secrets.randbits(120) for _ in range(50)]
    spare = private.obfuscators(20)  # made ahead, then 33 made with the batch
    assert private.decrypt_batch(private.encrypt_batch(values, spare)) == values
    assert spare == []
    assert private.raw_decrypt(public.raw_encrypt(12345)) == 12345


@pytest.mark.parametrize("scheme", ["paillier", "ou"])
def test_obfuscator_tables_give_the_same_powers_in_c_and_one_at_a_time(scheme: str) -> None:
    """A key's short-exponent tables: many powers at once (C) equal one at a time (the loop)
    and Python's pow of the table's base."""
    _, private = generate_keypair(scheme, 1024)
    exponents = [0, 1, 2 ** 256 - 1] + [secrets.randbits(256) for _ in range(30)]
    for table in private._short_tables():
        base = table.rows[0][1]
        many = table.powers(exponents)
        assert many == [table.power(e) for e in exponents]
        assert many == [pow(base, e, table.modulus) for e in exponents]
