"""Decoding a message holds the message and what it decodes to, never a multiple of it (issue
28: a signed 57 MiB envelope declaring a 60-million-item list took 973 MiB and 79 s to decode).
Each case opens one large signed message in a fresh process and reads its peak RSS."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from messages.codec import DECODE_FLOOR_BYTES
from tests.scenarios import REPO

MIB = 1 << 20
SIZE = 24 * MIB
"""Large enough to stand out of the RSS noise, small enough to build in a second."""

_OPEN_ONE = """
import json, sys, time
import msgpack
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from messages import DecodeError
from messages.envelope import WIRE_VERSION, MsgType
from messages.signing import SEAL_VERSION, _signed_bytes, federation_sealers

def kib(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) * 1024

case, size = sys.argv[1], int(sys.argv[2])
sealers = federation_sealers(["guest", "host"])
pack = msgpack.Packer(use_bin_type=True)
out = bytearray(pack.pack_map_header(7))
for key, value in (("version", WIRE_VERSION), ("job", "job"), ("task", "t"), ("sender", "host"),
                   ("recipient", "guest")):
    out += pack.pack(key) + pack.pack(value)
if case == "ciphertexts":  # a legitimate large message: one bytes field
    out += pack.pack("kind") + pack.pack(int(MsgType.ENCRYPTED_GRADIENTS)) + pack.pack("body")
    out += pack.pack_array_header(3) + pack.pack(1) + pack.pack(0) + pack.pack(bytes(size))
else:  # Decisions whose records list declares an item per byte (zeros), or one per 5 bytes
    per_item = b"\\x00" if case == "small_ints" else b"\\xce\\x7f\\xff\\xff\\xff"
    out += pack.pack("kind") + pack.pack(int(MsgType.DECISIONS)) + pack.pack("body")
    out += pack.pack_array_header(4) + pack.pack(0) + pack.pack_array_header(size // len(per_item))
    out += per_item * (size // len(per_item)) + pack.pack(3) + pack.pack(b"\\x07")
envelope = bytes(out)
del out
nonce, sent_at = bytes(16), time.time()
signature = Ed25519PrivateKey.from_private_bytes(sealers["host"].private).sign(
    _signed_bytes("host", nonce, sent_at, envelope))
sealed = msgpack.packb({"v": SEAL_VERSION, "signer": "host", "nonce": nonce, "sent_at": sent_at,
                        "envelope": envelope, "signature": signature}, use_bin_type=True)
del envelope
with open("/proc/self/clear_refs", "w") as handle:  # the peak from here on
    handle.write("5")
before = kib("VmRSS")
try:
    outcome = sealers["guest"].open(sealed).kind.name
except DecodeError as exc:
    outcome = f"refused: {exc}"
print(json.dumps({"size": len(sealed), "before": before, "peak": kib("VmHWM"),
                  "outcome": outcome}))
"""


def _open_in_fresh_process(case: str) -> tuple[int, int, str]:
    """The sealed message's size, how much the RSS grew while opening it, and the outcome."""
    done = subprocess.run([sys.executable, "-c", _OPEN_ONE, case, str(SIZE)], check=True,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    seen = json.loads(done.stdout)
    return int(seen["size"]), int(seen["peak"]) - int(seen["before"]), str(seen["outcome"])


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc")
@pytest.mark.parametrize("case, outcome, allowed", [
    # 24 million declared items, refused from the list's header before any is made
    ("small_ints", "refused: DECISIONS.records: declares 25165824 items", lambda size: 0),
    # 5 million distinct ints: made one by one until the budget runs out
    ("big_ints", "refused: DECISIONS.records[", lambda size: 2 * size + DECODE_FLOOR_BYTES),
    # the decoded array itself, and no other copy
    ("ciphertexts", "ENCRYPTED_GRADIENTS", lambda size: size),
])
def test_decoding_a_large_signed_message_holds_little_beyond_it(
        case: str, outcome: str, allowed: Callable[[int], int]) -> None:
    size, grew, seen = _open_in_fresh_process(case)
    assert seen.startswith(outcome), seen
    assert grew <= allowed(size) + 4 * MIB, \
        f"{case}: RSS grew {grew / MIB:.0f} MiB while opening {size / MIB:.0f} MiB ({seen})"
