"""Run a protocol flow on the embedded default: worker processes on in-memory queues."""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any, TypeVar

from flows.coordinator import DEFAULT_STEP_TIMEOUT, Coordinator, attached
from crypto.pool import default_processes
from flows.config import JobFile
from flows.declared import declaration, declared
from messages.signing import FLOW_IDENTITY, federation_sealers
from messages.transport import MemoryHub
from fedboost.worker import policy_of
from workers.policy import PartyPolicy
from workers.embedded import start_workers, stop_workers
from workers.lifeline import process_status
from workers.party import PartySpec

T = TypeVar("T")
FLOW_ENDPOINT = "flow"


def embedded_policy() -> PartyPolicy:
    """The policy of a party of the embedded default without a ``policy:`` of its own: every
    protocol declared. Every party runs on the operator's own machine, so no other
    organisation sees its ciphertexts; 1024-bit keys (of either scheme) are allowed there
    (tests, quick trials) unless the job file gives a party a stricter ``policy:``. Workers of a
    real federation default to ``workers.policy.MIN_KEY_BITS``. The operator sees every party's
    data anyway, so both prediction modes are answered, the key holder may fold bin sums and a
    job may fix its noise seed (``privacy.seed``: the benchmarks repeat runs exactly)."""
    return PartyPolicy(min_key_bits=1024, min_ou_key_bits=1024, protocols=tuple(declared()),
                       predict_modes=("path", "batched"), pack_bin_sums=("key_holder", "passive"),
                       fixed_noise_seed="allow")


def party_specs(config: JobFile, out_dir: Path,
                data: dict[str, Path] | None = None) -> list[PartySpec]:
    """Each party's local settings; its model part lives in ``out_dir/<party>``."""
    specs = []
    for name, party in config.parties.items():
        path = (data or {}).get(name, party.data)
        specs.append(PartySpec(name=name, role=party.role, data=str(path or ""),
                               id_column=party.id,
                               label=party.label, model_dir=str(out_dir / name),
                               columns=party.columns,
                               categorical=getattr(party, "categorical", None),
                               processes=processes_of(party),
                               policy=(policy_of(party.policy) if party.policy
                                       else embedded_policy()),
                               # beside the model parts, never inside one (a part may be shared)
                               state_dir=str(out_dir / ".fedboost" / name)))
    return specs


def processes_of(party: Any) -> int:
    """Worker processes of a party: passive parties default to one per core (histogram shards);
    the active party's one process spreads its crypto over the cores itself; horizontal parties
    have one."""
    if getattr(party, "processes", None) is not None:
        return int(party.processes)
    return default_processes() if party.role == "passive" else 1


def run_embedded(job: str, specs: list[PartySpec], run_flow: Callable[[], T], *,
                 hub: MemoryHub | None = None, log_level: int = logging.WARNING,
                 step_timeout: float = DEFAULT_STEP_TIMEOUT, end_to_end: bool = False) -> T:
    """Start the parties' workers, run the flow against them, and stop them whatever happens
    (``hub``: the caller's, which it closes itself; else one made and closed here)."""
    own_hub = hub is None
    hub = hub or MemoryHub([s.name for s in specs] + [FLOW_ENDPOINT],
                           helpers={s.name: s.processes - 1 for s in specs if s.processes > 1})
    # fresh keys: one machine, one run
    sealers = federation_sealers([s.name for s in specs], end_to_end=end_to_end)
    procs, helpers = start_workers(hub, specs, sealers, log_level)
    by_party = dict(zip([s.name for s in specs], procs, strict=True))
    coordinator = Coordinator(job=job, transport=hub.endpoint(FLOW_ENDPOINT),
                              sealer=sealers[FLOW_IDENTITY], timeout=step_timeout,
                              parties=tuple(by_party),
                              gone=lambda parties: exited(by_party, parties),
                              presence=lambda parties: stopped(by_party, parties))
    interrupted = False
    try:
        with attached(coordinator):  # the flow runs in this thread: its tasks find it
            return run_flow()
    except KeyboardInterrupt:
        interrupted = True
        raise
    finally:
        everyone = [*procs, *helpers]
        for proc in everyone:  # a failed flow never sent CLOSE_JOB; helpers serve until told
            if proc.is_alive():
                proc.terminate()  # SIGTERM: a worker finishes its step, then exits
        # after Ctrl-C the user waits: a worker still in its step after 3 s is killed
        # (checkpoints are written whole or not at all)
        stop_workers(everyone, timeout=3.0 if interrupted else 10.0)
        if own_hub:
            hub.close()


def exited(procs: dict[str, BaseProcess], parties: list[str]) -> dict[str, str]:
    """Of ``parties``, those whose worker process has ended, and how."""
    gone = {}
    for party in parties:
        proc = procs.get(party)
        if proc is None or proc.is_alive() or proc.exitcode is None:
            continue
        code = proc.exitcode
        how = (f"was killed by signal {signal.Signals(-code).name}" if code < 0
               else f"exited with code {code}")
        gone[party] = f"its worker process {how}"
    return gone


def stopped(procs: dict[str, BaseProcess], parties: list[str]) -> dict[str, str]:
    """Of ``parties``, those whose worker process is stopped (SIGSTOP, Ctrl-Z, a debugger)."""
    found = {}
    for party in parties:
        proc = procs.get(party)
        if (proc is not None and proc.pid is not None
                and process_status(proc.pid)[:1] in (["T"], ["t"])):
            found[party] = "its worker process is stopped"
    return found


def train_embedded(config: JobFile, out_dir: Path, *,
                   hub: MemoryHub | None = None) -> dict[str, Any]:
    """A whole federated training run on one machine, of the job's protocol."""
    flow = protocol_flow(config)
    specs = party_specs(config, out_dir)
    return run_embedded(config.job, specs, lambda: flow(config), hub=hub,
                        step_timeout=config.transport.step_timeout,
                        end_to_end=bool(config.signing and config.signing.end_to_end))


def protocol_flow(config: JobFile) -> Callable[[Any], dict[str, Any]]:
    """The Prefect flow that trains a job of ``config``'s protocol."""
    return declaration(config.protocol).training_flow()
