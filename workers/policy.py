"""A party's own policy: what its worker will do, whatever a job asks.

The policy comes from the party's worker file (or, in the embedded default, from its entry in
the job file, which one operator writes for every party); it is declared in
``messages.policy``, and here are its checks. A job that asks for less security than the policy
allows is refused; it never lowers the policy.
"""

from __future__ import annotations

import logging
from messages.policy import MIN_KEY_BITS as MIN_KEY_BITS, PartyPolicy
from workers import ProtocolError

log = logging.getLogger("fedboost.worker")

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
