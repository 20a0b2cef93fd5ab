"""A party's own policy, declared once: what its worker will do, whatever a job asks.

``PartyPolicy`` holds each setting with its default, its bounds or choices and its docstring.
The worker holds it (``workers.policy`` checks jobs against it); the ``policy:`` schema of a
worker file and of a job file's party (``flows.job_schema.PolicyConfig``) is made from its
fields, and the file's settings become a ``PartyPolicy`` whole, never field by field. A policy
is local: it never travels on the wire. A new setting: its field here, its check in
``workers.policy``, and its line in docs/job-files.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from boosting.params import bounds, check_fields

MIN_KEY_BITS = 2048
"""Default smallest Paillier modulus a party accepts: NIST SP 800-57 puts a 2048-bit RSA-type
modulus at 112-bit security; a 512-bit modulus is factored in hours, which would let a passive
party read every gradient and so every label."""

OBFUSCATORS = ("short", "full")
"""How a key holder draws Paillier obfuscators."""
PREDICT_MODES = ("path", "batched")
BIN_SUM_PACKERS = ("key_holder", "passive")
SCHEMES = ("paillier", "ou")
ROLES = ("active", "passive", "member", "aggregator")
ANSWERS = ("refuse", "allow")
KEY_BITS = bounds(ge=1024, le=8192)
"""Moduli a policy may ask for (the floor of a test key; the ceiling of a practical one)."""


@dataclass(frozen=True, slots=True)
class PartyPolicy:
    """What a party's worker accepts (see the module docstring)."""

    min_key_bits: int = field(default=MIN_KEY_BITS, metadata=KEY_BITS)
    """Smallest Paillier modulus this party generates (active) or accepts (passive)."""
    protocols: tuple[str, ...] = ("vertical_secureboost",)
    """Protocols this party takes part in."""
    obfuscator: str = field(default="short", metadata={"choices": OBFUSCATORS})
    """How the key holder draws Paillier obfuscators: ``short`` (a short exponent on a fixed
    base, fast) or ``full`` (a full-length random r^n)."""
    predict_modes: tuple[str, ...] = field(default=("path",), metadata={"each_of": PREDICT_MODES})
    """Prediction modes a passive party answers: ``path`` reveals only the decisions on each
    row's path; ``batched`` reveals all its decisions for every row to the active party."""
    pack_bin_sums: tuple[str, ...] = field(default=("passive",),
                                           metadata={"each_of": BIN_SUM_PACKERS})
    """Who may fold a passive party's encrypted bin sums (the job's ``crypto.pack_bin_sums``):
    ``passive`` (the default, alone) has it fold them itself under random high bits, so a
    decryption shows only the bits honest sums fill; ``key_holder``, the faster, has it send
    one sum per ciphertext, each a whole plaintext to the key holder, and is allowed only where
    the party's own policy lists it: a job never chooses it for a party. Against an active
    party that encrypts chosen values (``2**i`` for row i) in place of gradients, ``passive``
    cuts what each decrypted sum shows from ``n_bits`` to ``cell_bits``; over a job's trees it
    still reads every row (docs/threat-model.md gives the number of trees)."""
    roles: dict[str, tuple[str, ...]] = field(default_factory=dict, metadata={"each_of": ROLES})
    """Per protocol, the only roles this party takes (a protocol not named here: any)."""
    schemes: tuple[str, ...] = field(default=SCHEMES, metadata={"each_of": SCHEMES})
    """Encryption schemes this party generates (active) or accepts (passive)."""
    min_ou_key_bits: int = field(default=MIN_KEY_BITS, metadata=KEY_BITS)
    """Smallest Okamoto-Uchiyama modulus (n = p^2 q): its own floor, since a job's scheme
    must not lower the party's (docs/crypto.md argues 2048 bits for 112-bit security)."""
    horizontal_member_sets: str = field(default="refuse", metadata={"choices": ANSWERS})
    """A horizontal member's answer to a job over a data set it trained on before whose member
    set is a strict subset or superset of an earlier job's, so that the aggregator could
    subtract the two jobs' sums (``workers.horizontal.ledger``): ``refuse``, or ``allow``
    (logged) for an operator who accepts that residue."""
    horizontal_min_members: int = field(default=2, metadata=bounds(ge=2, le=1000))
    """Fewest members of a horizontal job this member joins. With two, each learns the other's
    exact row count and label sum (docs/horizontal.md); 3 refuses such jobs."""
    fixed_noise_seed: str = field(default="refuse", metadata={"choices": ANSWERS})
    """A job whose ``privacy.seed`` fixes the differential-privacy noise (``dp_seed``): whoever
    reads the spec replays the noise and subtracts it from the leaves and split choices it is
    shown. ``refuse`` (the default) has the party the noise protects (the vertical active
    party, a horizontal member) refuse such a job; ``allow`` (logged) is for experiments that
    must repeat a run exactly (the benchmarks, on the embedded default's policy)."""

    def __post_init__(self) -> None:
        check_fields(self)

    def min_bits(self, scheme: str) -> int:
        """This party's floor for a modulus of ``scheme``."""
        return self.min_ou_key_bits if scheme == "ou" else self.min_key_bits

    def refuses_role(self, protocol: str, role: str) -> str:
        """Why this policy refuses ``role`` in a job of ``protocol`` ("" if it does not)."""
        allowed = self.roles.get(protocol)
        if allowed is None or role in allowed:
            return ""
        return (f"the job gives it role {role!r} in {protocol}; its policy allows "
                f"{', '.join(allowed)}")
