"""A party's own policy: what its worker will do, whatever a job asks.

The policy comes from the party's worker file (or, in the embedded default, from its entry in
the job file, which one operator writes for every party). A job that asks for less security
than the policy allows is refused; it never lowers the policy.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Literal

from workers import ProtocolError

log = logging.getLogger("fedboost.worker")

MIN_KEY_BITS = 2048
"""Default smallest Paillier modulus a party accepts: NIST SP 800-57 puts a 2048-bit RSA-type
modulus at 112-bit security; a 512-bit modulus is factored in hours, which would let a passive
party read every gradient and so every label."""

Obfuscator = Literal["short", "full"]


@dataclass(frozen=True, slots=True)
class PartyPolicy:
    """What a party's worker accepts (see the module docstring)."""

    min_key_bits: int = MIN_KEY_BITS
    """Smallest Paillier modulus this party generates (active) or accepts (passive)."""
    protocols: tuple[str, ...] = ("vertical_secureboost",)
    """Protocols this party takes part in."""
    obfuscator: Obfuscator = "short"
    """How the key holder draws Paillier obfuscators: ``short`` (a short exponent on a fixed
    base, fast) or ``full`` (a full-length random r^n)."""
    predict_modes: tuple[str, ...] = ("path",)
    """Prediction modes a passive party answers: ``path`` reveals only the decisions on each
    row's path; ``batched`` reveals all its decisions for every row to the active party."""
    pack_bin_sums: tuple[str, ...] = ("passive",)
    """Who may fold a passive party's encrypted bin sums (the job's ``crypto.pack_bin_sums``):
    ``passive`` (the default, alone) has it fold them itself under random high bits, so a
    decryption shows only the bits honest sums fill; ``key_holder``, the faster, has it send
    one sum per ciphertext, each a whole plaintext to the key holder, and is allowed only where
    the party's own policy lists it: a job never chooses it for a party. Against an active
    party that encrypts chosen values (``2**i`` for row i) in place of gradients, ``passive``
    cuts what each decrypted sum shows from ``n_bits`` to ``cell_bits``; over a job's trees it
    still reads every row (docs/threat-model.md gives the number of trees)."""
    roles: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Per protocol, the only roles this party takes (a protocol not named here: any)."""
    schemes: tuple[str, ...] = ("paillier", "ou")
    """Encryption schemes this party generates (active) or accepts (passive)."""
    min_ou_key_bits: int = MIN_KEY_BITS
    """Smallest Okamoto-Uchiyama modulus (n = p^2 q): its own floor, since a job's scheme
    must not lower the party's (docs/crypto.md argues 2048 bits for 112-bit security)."""
    horizontal_member_sets: str = "refuse"
    """A horizontal member's answer to a job over a data set it trained on before whose member
    set is a strict subset or superset of an earlier job's, so that the aggregator could
    subtract the two jobs' sums (``workers.horizontal.ledger``): ``refuse``, or ``allow``
    (logged) for an operator who accepts that residue."""
    horizontal_min_members: int = 2
    """Fewest members of a horizontal job this member joins. With two, each learns the other's
    exact row count and label sum (docs/horizontal.md); 3 refuses such jobs."""
    fixed_noise_seed: str = "refuse"
    """A job whose ``privacy.seed`` fixes the differential-privacy noise (``dp_seed``): whoever
    reads the spec replays the noise and subtracts it from the leaves and split choices it is
    shown. ``refuse`` (the default) has the party the noise protects (the vertical active
    party, a horizontal member) refuse such a job; ``allow`` (logged) is for experiments that
    must repeat a run exactly (the benchmarks, on the embedded default's policy)."""

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


class PolicyError(ProtocolError):
    """A job asks for what the party's policy does not allow."""


def check_job(policy: PartyPolicy, party: str, protocol: str, key_bits: int,
              scheme: str = "paillier") -> None:
    """Refuse a job below the party's policy, in one line naming the party, asked and allowed."""
    check_protocol(policy, party, protocol)
    check_key_bits(policy, party, key_bits, "the job asks for", scheme)


def check_protocol(policy: PartyPolicy, party: str, protocol: str) -> None:
    """Refuse a protocol the party's policy does not list."""
    if protocol not in policy.protocols:
        raise PolicyError(f"party {party} refuses protocol {protocol!r}: its policy allows "
                          f"{', '.join(policy.protocols)}")


def check_bin_sum_packer(policy: PartyPolicy, party: str, packer: str, why: str) -> None:
    """Refuse bin sums folded by a party the policy does not allow (``pack_bin_sums``)."""
    if packer not in policy.pack_bin_sums:
        raise PolicyError(f"party {party} refuses to send its bin sums for the key holder to "
                          f"fold ({why}): its policy (pack_bin_sums) allows "
                          f"{', '.join(policy.pack_bin_sums)} only; set the job's "
                          f"crypto.pack_bin_sums: passive")


def check_noise_seed(policy: PartyPolicy, party: str, dp_seed: int) -> None:
    """Refuse a job that fixes its noise seed (``dp_seed >= 0``) unless the policy allows it."""
    if dp_seed < 0:
        return
    if policy.fixed_noise_seed != "allow":
        raise PolicyError(f"party {party} refuses a job whose privacy.seed fixes the noise "
                          f"({dp_seed}): anyone who reads the job replays the noise and removes "
                          f"it; drop privacy.seed, or set fixed_noise_seed: allow in the "
                          f"party's policy (experiments only)")
    log.warning("%s: the job fixes its noise seed (privacy.seed); this party's policy allows "
                "it (fixed_noise_seed: allow): whoever reads the job can replay the noise", party)


def check_key_bits(policy: PartyPolicy, party: str, key_bits: int, what: str,
                   scheme: str = "paillier") -> None:
    """Refuse a scheme the policy does not list, or a modulus below its floor for that scheme."""
    name = {"paillier": "Paillier", "ou": "Okamoto-Uchiyama"}.get(scheme, repr(scheme))
    if scheme not in policy.schemes:
        raise PolicyError(f"party {party} refuses {name} encryption ({what}): its policy "
                          f"allows {', '.join(policy.schemes)}")
    if key_bits < policy.min_bits(scheme):
        raise PolicyError(f"party {party} refuses a {key_bits}-bit {name} key ({what}): its "
                          f"policy requires at least {policy.min_bits(scheme)} bits")
