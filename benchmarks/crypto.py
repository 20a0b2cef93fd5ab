"""Paillier throughput, ours against phe and the raw GMP floor, in one run.

    python -m benchmarks.crypto [--bits 1024 2048] [--seconds 1.0]

Rows: encrypt (ours as key holder with CRT, with the short-exponent or the full r^n obfuscator,
or with obfuscators made ahead as the crypto processes make them while the party waits;
ours with the public key only; phe), add (ours,
phe, raw gmpy2 ``c1*c2 % n2``), decrypt (ours CRT, phe CRT), histogram accumulation (the
passive party's per-bin ciphertext products on a default_credit-sized node, as multiplies/s,
in crypto.bin_products' C kernel and again in its gmpy2 loop), obfuscators made (the key
holder's short-exponent window powers, in the C kernel and in the loop),
and bin sums brought back to plaintext, one decryption each or packed several per ciphertext
(crypto.compress: pack + decrypt + unpack), as sums/s.

Then the same key sizes under Okamoto-Uchiyama (``crypto.ou``, n = p^2 q) beside Paillier, in
the same run: encrypt (key holder, and with obfuscators made ahead), add, decrypt, histogram
accumulation, bin sums folded by the key holder, with the OU/Paillier ratio of each
(``--schemes paillier`` skips them).
"""

from __future__ import annotations

from typing import Any

import argparse
import random
import time
from collections.abc import Callable

import numpy as np
import phe

from crypto.compress import BinSumPacking, decrypt_bin_sums
from crypto.encoding import GradientPacker
from crypto import ou
from crypto.paillier import PaillierPrivateKey, generate_keypair
from crypto.schemes import PrivateKey


def rate(fn: Callable[[int], object], seconds: float) -> float:
    """Operations per second: ``fn(k)`` performs k operations; grow k until it takes long enough."""
    k = 16
    while True:
        start = time.perf_counter()
        fn(k)
        spent = time.perf_counter() - start
        if spent >= seconds:
            return k / spent
        k = max(k * 2, int(k * seconds / max(spent, 1e-6) * 1.1))


def spare_rate(private: PrivateKey, plain: list[int], count: int = 4096) -> float:
    """Encryptions/s once the obfuscators are made (``crypto.pool``'s ahead-of-time ones):
    making them is not timed, it happens while the key holder waits for other parties."""
    spare = private.obfuscators(count)
    start = time.perf_counter()
    private.encrypt_batch((plain[i % 64] for i in range(count)), spare)
    return count / (time.perf_counter() - start)


def measure(bits: int, seconds: float) -> dict[str, float]:
    public, private = generate_keypair(bits)
    phe_pub = phe.PaillierPublicKey(int(public.n))
    phe_priv = phe.PaillierPrivateKey(phe_pub, int(private.p), int(private.q))
    plain = [random.getrandbits(bits // 2) for _ in range(64)]
    cts = private.encrypt_batch(plain)
    nsq = public.nsquare
    phe_cts = [phe_pub.encrypt(v) for v in plain[:8]]
    private.encrypt_batch([1])  # build the window tables outside the timing
    public.raw_encrypt(1)
    full = PaillierPrivateKey(public, private.p, private.q, "full")
    out = {
        "encrypt ours (key holder, CRT)": rate(lambda k: private.encrypt_batch(plain[i % 64] for i in range(k)), seconds),
        "encrypt ours (key holder, CRT, full r^n)": rate(lambda k: full.encrypt_batch(plain[i % 64] for i in range(k)), seconds),
        "encrypt ours (obfuscators made ahead)": spare_rate(private, plain),
        "encrypt ours (public key)": rate(lambda k: [public.raw_encrypt(plain[i % 64]) for i in range(k)], seconds),
        "encrypt phe": rate(lambda k: [phe_pub.encrypt(plain[i % 64]) for i in range(k)], seconds),
        "add ours": rate(lambda k: [public.add(cts[i % 64], cts[(i + 1) % 64]) for i in range(k)], seconds),
        "add phe": rate(lambda k: [phe_cts[i % 8] + phe_cts[(i + 1) % 8] for i in range(k)], seconds),
        "add raw gmpy2 c1*c2 % n2 (floor)": rate(lambda k: [cts[i % 64] * cts[(i + 1) % 64] % nsq for i in range(k)], seconds),
        "decrypt ours (CRT)": rate(lambda k: [private.raw_decrypt(cts[i % 64]) for i in range(k)], seconds),
        "decrypt phe (CRT)": rate(lambda k: [phe_priv.raw_decrypt(int(cts[i % 64])) for i in range(k)], seconds),
    }
    out[OBFUSCATOR_ROW] = obfuscator_rate(private, seconds, native=True)
    out[OBFUSCATOR_PYTHON_ROW] = obfuscator_rate(private, seconds, native=False)
    out["histogram accumulation (mults/s)"] = histogram_rate(public, private, seconds)
    out[PYTHON_ROW] = histogram_rate(public, private, seconds, native=False)
    out.update(bin_sum_rates(public, private, seconds))
    return out


PYTHON_ROW = "  the same in the gmpy2 loop (mults/s)"
"""The histogram row again, in crypto.bin_products' Python loop rather than its C kernel."""
OBFUSCATOR_ROW = "obfuscators made (short exponent; C)"
OBFUSCATOR_PYTHON_ROW = "  the same in the gmpy2 loop (obfuscators/s)"


def obfuscator_rate(private: PrivateKey, seconds: float, native: bool) -> float:
    """The key holder's short-exponent obfuscators per second, both residues (what the
    preparer processes make ahead), from the key's window tables in the C kernel or its loop."""
    from crypto.paillier import short_obfuscators

    tables = private._short_tables()
    return rate(lambda k: short_obfuscators(tables, k, native), seconds)


def histogram_rate(public: Any, private: Any, seconds: float,
                   native: bool | None = None) -> float:
    """The passive party's kernel on 4,096 rows x 10 features, as ciphertext multiplies per
    second (``native``: crypto.bin_products' C kernel, its gmpy2 loop, or whichever runs)."""
    from crypto.bin_products import bin_products

    rows = 4096
    cts = private.encrypt_batch(random.getrandbits(100) for _ in range(rows))
    bins = np.random.default_rng(0).integers(0, 33, size=(rows, 10)).astype(np.uint8)
    index = np.arange(rows)

    # rate() counts calls; each call is about one multiply per row and feature
    return rows * 10 * rate(lambda k: [bin_products(bins, index, cts, 33,
                                                    public.cipher_modulus, native)
                                       for _ in range(k)], seconds)


BENCH_PACKER = GradientPacker(value_bits=42, max_rows=30_000)
"""default_credit's training rows: 59-bit slots, 177-bit bin sums."""


def bin_sum_rates(public: Any, private: Any, seconds: float) -> dict[str, float]:
    """Bin sums to plaintext per second: decrypted one by one, or packed, decrypted, unpacked."""
    packing = BinSumPacking.for_key(BENCH_PACKER.cell_bits, public.n.bit_length())
    per, nsq = packing.per_ciphertext, public.nsquare
    plain = BENCH_PACKER.pack([random.randint(-2**42, 2**42) for _ in range(per)],
                              [random.randint(0, 2**42) for _ in range(per)])
    cts = private.encrypt_batch(plain)
    packed_once = packing.pack(cts, nsq)
    if packing.unpack(private.decrypt_batch(packed_once), per) != plain:
        raise RuntimeError("packed bin sums did not come back exactly")

    def one_by_one(k: int) -> None:
        for i in range(k):
            BENCH_PACKER.unpack_sum(private.raw_decrypt(cts[i % per]))

    def packed(k: int) -> None:
        for _ in range(k):
            for m in packing.unpack(private.decrypt_batch(packing.pack(cts, nsq)), per):
                BENCH_PACKER.unpack_sum(m)

    run = private.fold_run(BENCH_PACKER.cell_bits)
    if decrypt_bin_sums(private, cts, BENCH_PACKER.cell_bits) != plain:
        raise RuntimeError("bin sums folded by the key holder did not come back exactly")

    def folded_by_key_holder(k: int) -> None:
        for _ in range(k):
            for m in decrypt_bin_sums(private, cts[:run], BENCH_PACKER.cell_bits):
                BENCH_PACKER.unpack_sum(m)

    # rate() counts calls of ``packed``; each brings back one packed ciphertext's sums
    return {
        "bin sums folded by the key holder mod p^2 (sums/s)": run * rate(folded_by_key_holder,
                                                                         seconds),
        "bin sums, one decryption each (sums/s)": rate(one_by_one, seconds),
        "bin sums packed (sums/s)": per * rate(packed, seconds),
        "  of which packing them (sums/s)": per * rate(
            lambda k: [packing.pack(cts, nsq) for _ in range(k)], seconds),
        "  of which decrypting them (sums/s)": per * rate(
            lambda k: [[BENCH_PACKER.unpack_sum(m)
                        for m in packing.unpack(private.decrypt_batch(packed_once), per)]
                       for _ in range(k)], seconds),
    }


SCHEME_ROWS = ("encrypt ours (key holder, CRT)", "encrypt ours (obfuscators made ahead)",
               "encrypt ours (public key)", "add ours", "decrypt ours (CRT)",
               "histogram accumulation (mults/s)", PYTHON_ROW,
               "bin sums folded by the key holder mod p^2 (sums/s)", OBFUSCATOR_ROW,
               OBFUSCATOR_PYTHON_ROW)
"""The rows both schemes have, measured the same way."""


def measure_ou(bits: int, seconds: float) -> dict[str, float]:
    """:data:`SCHEME_ROWS` under Okamoto-Uchiyama at ``bits`` (n = p^2 q)."""
    public, private = ou.generate_keypair(bits)
    plain = [random.getrandbits(BENCH_PACKER.cell_bits) for _ in range(64)]  # a packed row
    cts = private.encrypt_batch(plain)
    private.encrypt_batch([(1 << BENCH_PACKER.cell_bits) - 1])  # tables built outside the timing
    public.raw_encrypt((1 << BENCH_PACKER.cell_bits) - 1)
    sums = cts[:private.fold_run(BENCH_PACKER.cell_bits)]
    return {
        SCHEME_ROWS[0]: rate(lambda k: private.encrypt_batch(plain[i % 64] for i in range(k)), seconds),
        SCHEME_ROWS[1]: spare_rate(private, plain),
        SCHEME_ROWS[2]: rate(lambda k: [public.raw_encrypt(plain[i % 64]) for i in range(k)], seconds),
        SCHEME_ROWS[3]: rate(lambda k: [public.add(cts[i % 64], cts[(i + 1) % 64]) for i in range(k)], seconds),
        SCHEME_ROWS[4]: rate(lambda k: [private.raw_decrypt(cts[i % 64]) for i in range(k)], seconds),
        SCHEME_ROWS[5]: histogram_rate(public, private, seconds),
        SCHEME_ROWS[6]: histogram_rate(public, private, seconds, native=False),
        SCHEME_ROWS[7]: len(sums) * rate(lambda k: [decrypt_bin_sums(
            private, sums, BENCH_PACKER.cell_bits) for _ in range(k)], seconds),
        OBFUSCATOR_ROW: obfuscator_rate(private, seconds, native=True),
        OBFUSCATOR_PYTHON_ROW: obfuscator_rate(private, seconds, native=False),
    }


def print_schemes(paillier: dict[int, dict[str, float]], ou_rates: dict[int, dict[str, float]]
                  ) -> None:
    """OU beside Paillier, row by row, with OU/Paillier ratios (> 1: OU faster)."""
    print(f"{'operation (ops/s, one core)':<44}" + "".join(
        f"{f'P{b}':>11}{f'OU{b}':>11}{'OU/P':>7}" for b in ou_rates))
    for name in SCHEME_ROWS:
        print(f"{name:<44}" + "".join(
            f"{paillier[b][name]:>11,.0f}{ou_rates[b][name]:>11,.0f}"
            f"{ou_rates[b][name] / paillier[b][name]:>6.1f}x" for b in ou_rates))
    for b in ou_rates:
        width_p = 2 * b // 8
        width_o = b // 8
        per_p = BinSumPacking.for_key(BENCH_PACKER.cell_bits, b).per_ciphertext
        per_o = BinSumPacking.for_key(BENCH_PACKER.cell_bits, b // 3).per_ciphertext
        print(f"{b} bits: a ciphertext is {width_o} B under OU, {width_p} B under Paillier "
              f"({width_o / width_p:.2f}x); {BENCH_PACKER.cell_bits}-bit bin sums per packed "
              f"plaintext: OU {per_o}, Paillier {per_p}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--bits", type=int, nargs="+", default=[1024, 2048])
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--schemes", nargs="+", default=["paillier", "ou"],
                        choices=["paillier", "ou"])
    args = parser.parse_args()
    results = {bits: measure(bits, args.seconds) for bits in args.bits}
    ou_rates = ({bits: measure_ou(bits, args.seconds) for bits in args.bits}
                if "ou" in args.schemes else {})
    print(f"{'operation (ops/s, one core)':<44}" + "".join(f"{b:>12}" for b in args.bits))
    for name in next(iter(results.values())):
        print(f"{name:<44}" + "".join(f"{results[b][name]:>12,.0f}" for b in args.bits))
    print()
    for b in args.bits:
        r = results[b]
        one, packed = r["bin sums, one decryption each (sums/s)"], r["bin sums packed (sums/s)"]
        shifts = r["  of which packing them (sums/s)"]
        holder = r["  of which decrypting them (sums/s)"]
        short, full = (r["encrypt ours (key holder, CRT)"],
                       r["encrypt ours (key holder, CRT, full r^n)"])
        print(f"{b} bits: obfuscator short/full = {short / full:.1f}x (key holder encryptions "
              f"per second)")
        print(f"{b} bits: encrypt ours/phe = {r['encrypt ours (key holder, CRT)'] / r['encrypt phe']:.0f}x; "
              f"histogram accumulation / raw multiply = "
              f"{r['histogram accumulation (mults/s)'] / r['add raw gmpy2 c1*c2 % n2 (floor)']:.2f}; "
              f"decrypt ours/phe = {r['decrypt ours (CRT)'] / r['decrypt phe (CRT)']:.1f}x; "
              f"histogram accumulation C kernel / gmpy2 loop = "
              f"{r['histogram accumulation (mults/s)'] / r[PYTHON_ROW]:.2f}x; "
              f"obfuscators C kernel / gmpy2 loop = "
              f"{r[OBFUSCATOR_ROW] / r[OBFUSCATOR_PYTHON_ROW]:.2f}x")
        per = BinSumPacking.for_key(BENCH_PACKER.cell_bits, b).per_ciphertext
        by_holder = r["bin sums folded by the key holder mod p^2 (sums/s)"]
        print(f"{b} bits: per bin sum, folded by the key holder modulo p^2 {1e3 / by_holder:.3f} "
              f"ms: {packed and by_holder / packed:.2f}x less than packed by the passive party "
              f"and decrypted (crypto.pack_bin_sums)")
        print(f"{b} bits: per bin sum, one decryption {1e3 / one:.3f} ms; packed {per} per "
              f"ciphertext {1e3 / packed:.3f} ms (passive packing {1e3 / shifts:.3f} ms, key "
              f"holder decrypting {1e3 / holder:.3f} ms); packing pays {packed / one:.1f}x "
              f"overall, {holder / one:.0f}x for the key holder")
    if ou_rates:
        print()
        print_schemes(results, ou_rates)


if __name__ == "__main__":
    main()
