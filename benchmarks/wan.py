"""Vertical SecureBoost with the organisations on hosts of their own, over a WAN (issue 38).

    python -m benchmarks.wan [--profile lan 100mbit-50ms 10mbit-50ms] [--scheme paillier ou]
                             [--trees 10] [--bits 2048] [--workload default_credit|scale]
                             [--rows 1000000 --features 100 --depth 5] [--json FILE]
                             [--timeline DIR] [--topology per-org|shared]

The topology (``--topology per-org``, the default) is ``deploy/netns-federation.sh up
--per-org``'s under this benchmark's own prefix and /24: the lender (guest) and the data provider
(host) each in its own namespace with its own broker, each worker connected only to its own
broker, the brokers joined by RabbitMQ's shovels over TLS, the flow in this process (the root
namespace, over the bridge: the lender's LAN). The data provider's link to the bridge is
rate-limited by ``tc tbf`` and both directions of the brokers' links cross a delay relay
(``benchmarks.wan_links``: address translation with ``nft`` puts ``benchmarks.wan_relay`` on
the shovels' path), so every message between the organisations crosses the WAN once and each
organisation's own traffic (a worker and its broker, the flow and the lender's broker) stays
on its LAN. ``--topology shared``: the one broker at the lender, the data provider's worker
connected to it across the WAN through the relay (each of its broker round trips, such as a
publisher confirm, crosses the WAN). Profiles (``benchmarks.wan_relay.PROFILES``): ``lan``
(the relays, no delay, no limit), ``1gbit-5ms``, ``100mbit-50ms`` (SecretFlow's SGB setting),
``10mbit-50ms``; the delay is one way. Needs ``nft`` (Debian's ``nftables``) for per-org.

``loopback`` is the baseline measured in the same run: one broker (with ``per-org``,
``--loopback-url``: this machine's own), both workers in this namespace, no relay, no limit.
Per scheme the runs go loopback first, then the profiles.

Per profile and scheme (means over the trees): s/tree; bytes per tree each way (counted at the
relay: ``up`` from the data provider, ``down`` to it); turns per tree (messages going up after
messages came down: request/answer pairs between the organisations that waited a round trip,
``wan_relay.turns``); and where a tree's time goes: ``steps`` (inside the flow's Prefect tasks:
computing and messaging), of which ``wire`` is what the profile adds over loopback's steps, and
``flow`` (between the tasks: the flow's own orchestration). ``floor`` is the wire's least cost:
turns x the round trip + the busier direction's bytes / the rate. The goal column is
s/tree <= 1.25 x max(loopback s/tree, bytes per tree / rate).

Per run, the mean seconds per tree of each task (``build-histograms-d0``, ...) are logged and
kept in the JSON; ``--timeline DIR`` also writes every task's span and every read the relay
made (time, direction, bytes), one file per run: a tree's critical path, drawn.

``--workload scale``: benchmarks.scale's data (``--rows`` x ``--features``, depth ``--depth``,
1 tree unless ``--trees``; the host with one helper process), loopback against each profile.

Runs as root (it makes namespaces and links, all removed at the end). The load average is
printed and kept with every run.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import tempfile
import uuid
from pathlib import Path
from typing import Any

import yaml

from benchmarks.rabbitmq import _job
from benchmarks.train import step_seconds, task_runs
from benchmarks.wan_hosts import Hosts
from benchmarks.wan_relay import PROFILES, Profile, start_relay, turns
from fedboost import _prefect_env
from flows.broker_settings import AMQP_URL_ENV
from fedboost.local_workers import FEDBOOST, start_worker, stop_workers, worker_env
from messages.broker_url import without_password
from messages.rabbit_queues import delete_party_queues

RELAY_PORT = 5673
log = logging.getLogger("benchmarks.wan")


BESIDE_THE_NEXT = ("drop-tree-",)
"""Tasks of a tree the flow does not wait for (the passive parties' drop of it)."""


def tree_windows(flow_run_id: object) -> dict[int, dict[str, float]]:
    """Per tree: the wall clock its first task started and its last ended, and the time inside
    its tasks (their union: tasks that overlap count once)."""
    import re

    spans: dict[int, list[tuple[float, float]]] = {}
    for run in task_runs(flow_run_id):
        if (run.name or "").startswith(BESIDE_THE_NEXT):
            continue  # runs beside the next tree: its bytes and time are that tree's
        found = re.search(r"-t(\d+)(-d\d+)?$", run.name or "")
        if found and run.start_time and run.end_time:
            spans.setdefault(int(found.group(1)), []).append(
                (run.start_time.timestamp(), run.end_time.timestamp()))
    out = {}
    for tree, intervals in spans.items():
        intervals.sort()
        inside, reach = 0.0, float("-inf")
        for start, end in intervals:
            if end > reach:
                inside += end - max(start, reach)
                reach = end
        out[tree] = {"start": intervals[0][0], "end": max(e for _, e in intervals),
                     "steps": inside}
    return out


def job_file(args: argparse.Namespace, work: Path, url: str, scheme: str,
             data: dict[str, Path] | None, tag: str) -> tuple[Path, list[str]]:
    """This run's job (its own name; the parties ``guest<tag>`` and ``host<tag>``) over the
    broker at ``url``."""
    run = uuid.uuid4().hex[:6]
    if args.workload == "scale":
        from benchmarks.scale import job_file as scale_job

        assert data is not None
        path, parties = scale_job(work, data, tag, url, args, scheme)
        raw = yaml.safe_load(path.read_text())
    else:
        raw = _job(tag, url, args.bits, args.trees, work / "keys")
        for party in raw["parties"].values():
            party["policy"]["min_ou_key_bits"] = min(args.bits, 2048)
        raw["crypto"]["scheme"] = scheme
    raw["job"] = f"{raw['job']}-{run}"
    path = work / f"job-{run}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path, list(raw["parties"])


def measure(args: argparse.Namespace, hosts: Hosts, scheme: str, profile: Profile | None,
            work: Path, data: dict[str, Path] | None) -> dict[str, Any]:
    """One training run: ``profile`` None is the loopback baseline (one broker: this machine's
    own with ``--topology per-org``, both workers in this namespace)."""
    from flows.config import load_config
    from flows.secureboost import vertical_secureboost

    per_org = hosts.per_org and profile is not None
    loopback_url = args.loopback_url if hosts.per_org else hosts.broker
    url = hosts.broker if profile is not None else loopback_url
    in_job = hosts.broker_in_job if profile is not None else without_password(loopback_url)
    tag = hosts.tag if hosts.per_org else uuid.uuid4().hex[:6]
    path, (guest, host) = job_file(args, work, in_job, scheme, data, tag)
    record = work / f"relay-{uuid.uuid4().hex[:6]}.json"
    relay, links, host_url = None, None, url
    procs = []
    load_before = os.getloadavg()
    try:
        if per_org and profile is not None:
            hosts.purge([guest, host])
            links = hosts.links(profile, work)
            links.__enter__()
            host_url = hosts.url("host")  # its own broker, in its own namespace
        elif profile is not None:
            hosts.shape(profile)
            _, address, _ = hosts.hosts["guest"]
            relay = start_relay(hosts.namespace("host"), ("127.0.0.1", RELAY_PORT),
                                (address, 5672), profile.delay, record)
            host_url = url.replace(f"@{address}:5672", f"@127.0.0.1:{RELAY_PORT}")
        host_processes = 2 if args.workload == "scale" else 1
        for party, name, n, party_url in ((guest, "guest", 1, url),
                                          (host, "host", host_processes, host_url)):
            command = FEDBOOST if profile is None else (*hosts.namespace(name), *FEDBOOST)
            procs.append(start_worker(
                party, path, cwd=work, log=work / f"{party}.log", command=command,
                env=worker_env(FEDBOOST_AMQP_URL=party_url),
                args=["--models", str(work / "models"), "--processes", str(n),
                      "--log-level", "WARNING"]))
        os.environ[AMQP_URL_ENV] = url  # the flow's (this process's) broker
        state = vertical_secureboost(load_config(path), return_state=True)
        result = state.result()
    finally:
        os.environ.pop(AMQP_URL_ENV, None)
        codes = stop_workers(procs)
        if links is not None:
            links.__exit__(None, None, None)
        if relay is not None:
            relay.terminate()
            relay.wait(timeout=60)
            hosts.shape(PROFILES["lan"])
        if not per_org:
            delete_party_queues(url, [guest, host])
    if any(codes):
        raise RuntimeError(f"workers exited {codes}: {(work / f'{host}.log').read_text()[-2000:]}")
    load_after = os.getloadavg()
    windows = tree_windows(state.state_details.flow_run_id)
    if links is not None:
        chunks = links.relayed()
    else:
        chunks = json.loads(record.read_text())["chunks"] if relay is not None else []
    if args.timeline is not None:  # every task's span and every relayed read, to plot
        args.timeline.mkdir(parents=True, exist_ok=True)
        name = f"{scheme}-{'loopback' if profile is None else profile.name}.json"
        (args.timeline / name).write_text(json.dumps({
            "trees": windows, "relayed": chunks,
            "tasks": [(r.name, r.start_time.timestamp(), r.end_time.timestamp())
                      for r in task_runs(state.state_details.flow_run_id)
                      if r.start_time and r.end_time]}))
    per_tree = []
    for tree, seconds in enumerate(result["tree_seconds"]):
        w = windows[tree]
        inside = [c for c in chunks if w["start"] <= c[0] < w["end"]]
        per_tree.append({
            "seconds": seconds, "steps": w["steps"], "flow": max(0.0, seconds - w["steps"]),
            "bytes_up": sum(c[2] for c in inside if c[1] == "up"),
            "bytes_down": sum(c[2] for c in inside if c[1] == "down"),
            "turns": turns(inside)})
    n = len(per_tree)
    mean = {key: sum(t[key] for t in per_tree) / n for key in per_tree[0]}
    numbers = {"profile": "loopback" if profile is None else profile.name, "scheme": scheme,
               "s_per_tree": mean["seconds"], "steps_per_tree": mean["steps"],
               "flow_per_tree": mean["flow"], "bytes_up_per_tree": mean["bytes_up"],
               "bytes_down_per_tree": mean["bytes_down"], "turns_per_tree": mean["turns"],
               "setup_seconds": result["train_seconds"] - sum(result["tree_seconds"]),
               "all_bytes_up": sum(c[2] for c in chunks if c[1] == "up"),
               "all_bytes_down": sum(c[2] for c in chunks if c[1] == "down"),
               "train_auc": result["train_auc"], "trees": per_tree,
               "task_seconds_per_tree": _per_tree_tasks(state.state_details.flow_run_id, n),
               "load_average": [round(x, 2) for x in (*load_before, *load_after)]}
    if profile is not None:
        rate = profile.rate_bits
        busier = max(mean["bytes_up"], mean["bytes_down"]) * 8
        numbers["wire_seconds_per_tree_at_rate"] = busier / rate if rate else 0.0
        numbers["floor_per_tree"] = (mean["turns"] * 2 * profile.delay
                                     + numbers["wire_seconds_per_tree_at_rate"])
    log.warning("%s %s: %.2f s/tree, %.0f turns/tree, %.2f MB up, %.2f MB down per tree, load %s",
                numbers["profile"], scheme, mean["seconds"], mean["turns"],
                mean["bytes_up"] / 1e6, mean["bytes_down"] / 1e6, numbers["load_average"])
    log.warning("%s %s: seconds per tree by task: %s", numbers["profile"], scheme,
                ", ".join(f"{k} {v:.2f}" for k, v in numbers["task_seconds_per_tree"].items()))
    return numbers


def _per_tree_tasks(flow_run_id: object, trees: int) -> dict[str, float]:
    """Each tree task's mean seconds per tree, per depth (``build-histograms-d0``): where
    inside the steps a tree's time goes."""
    totals = step_seconds(flow_run_id, by_depth=True)
    return {name: round(seconds / trees, 3) for name, seconds in sorted(totals.items())
            if name.endswith(tuple(f"-d{d}" for d in range(64))) or name in TREE_TASKS}


TREE_TASKS = ("encrypt-gradients", "finish-tree", "drop-tree")
"""The per-tree tasks without a depth (the others are named per level)."""


def judge(runs: list[dict[str, Any]], workload: str) -> None:
    """Each profile's time against loopback's of its scheme: wire added, goal and ratio."""
    base = {r["scheme"]: r for r in runs if r["profile"] == "loopback"}
    for r in runs:
        b = base[r["scheme"]]
        r["ratio_to_loopback"] = r["s_per_tree"] / b["s_per_tree"]
        r["wire_per_tree"] = max(0.0, r["steps_per_tree"] - b["steps_per_tree"])
        if r["profile"] == "loopback":
            continue
        bound = 1.25 * max(b["s_per_tree"], r["wire_seconds_per_tree_at_rate"])
        r["goal_s_per_tree"] = bound
        r["goal_met"] = r["s_per_tree"] <= bound
        if r["profile"] == "100mbit-50ms" and (workload == "scale" or r["scheme"] == "ou"):
            limit = 1.15 if workload == "scale" else 1.3
            r["goal_ratio"] = limit
            r["goal_met"] = r["goal_met"] and r["ratio_to_loopback"] <= limit


def report(runs: list[dict[str, Any]], title: str) -> None:
    print(f"\n{title}")
    print(f"{'scheme':<9}{'profile':<14}{'s/tree':>8}{'x loop':>8}{'MB up':>8}{'MB down':>9}"
          f"{'turns':>7}{'steps':>8}{'wire':>7}{'flow':>7}{'floor':>7}{'goal s':>8}  met  load")
    for r in runs:
        goal = r.get("goal_s_per_tree")
        met = "" if "goal_met" not in r else ("yes" if r["goal_met"] else "NO")
        print(f"{r['scheme']:<9}{r['profile']:<14}{r['s_per_tree']:>8.2f}"
              f"{r['ratio_to_loopback']:>7.2f}x{r['bytes_up_per_tree'] / 1e6:>8.2f}"
              f"{r['bytes_down_per_tree'] / 1e6:>9.2f}{r['turns_per_tree']:>7.0f}"
              f"{r['steps_per_tree']:>8.2f}{r['wire_per_tree']:>7.2f}{r['flow_per_tree']:>7.2f}"
              f"{r.get('floor_per_tree', 0.0):>7.2f}{goal if goal else 0.0:>8.2f}  {met:<4} "
              f"{r['load_average'][0]:.1f}/{r['load_average'][3]:.1f}")
    print("per tree: s/tree and x loopback; MB each way at the relay (up: from the data provider);"
          " turns: request/answer pairs over the WAN; steps: inside the flow's tasks, wire: steps"
          " over loopback's, flow: between tasks; floor: turns x RTT + bytes / rate; goal s:"
          " 1.25 x max(loopback, bytes / rate) (OU at 100mbit-50ms also <= 1.3x loopback, the"
          " scale workload <= 1.15x); load: 1-min load average before/after the run")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--profile", nargs="+", choices=list(PROFILES),
                        default=["lan", "100mbit-50ms", "10mbit-50ms"])
    parser.add_argument("--scheme", nargs="+", choices=["paillier", "ou"], default=["paillier"])
    parser.add_argument("--workload", choices=["default_credit", "scale"],
                        default="default_credit")
    parser.add_argument("--trees", type=int, default=None,
                        help="trees per run (default 10; the scale workload 1)")
    parser.add_argument("--bits", type=int, default=2048)
    parser.add_argument("--rows", type=int, default=1_000_000, help="scale: rows per party")
    parser.add_argument("--features", type=int, default=100, help="scale: features in all")
    parser.add_argument("--depth", type=int, default=5, help="scale: tree depth")
    parser.add_argument("--topology", choices=["per-org", "shared"], default="per-org",
                        help="per-org: a broker per organisation, shovels between them over the "
                             "WAN; shared: the lender's broker, the data provider's worker "
                             "connected to it over the WAN")
    parser.add_argument("--loopback-url", default="amqp://guest:guest@127.0.0.1:5672/%2F",
                        help="per-org: the one broker of the loopback baseline (this machine's)")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--timeline", type=Path, metavar="DIR",
                        help="write each run's task spans and relayed reads (wall clock) here")
    args = parser.parse_args()
    args.trees = args.trees or (1 if args.workload == "scale" else 10)
    if os.geteuid() != 0:
        parser.error("runs as root: it makes network namespaces")
    _prefect_env.configure()
    import flows.secureboost  # noqa: F401  (Prefect's loggers exist from here on)

    for name in ("prefect", "prefect.task_runs", "prefect.flow_runs"):
        logging.getLogger(name).setLevel(logging.WARNING)
    logging.basicConfig(format="%(asctime)s %(name)s %(message)s")
    runs: list[dict[str, Any]] = []
    per_org = args.topology == "per-org"
    with tempfile.TemporaryDirectory(prefix="fedboost-wan-") as tmp, Hosts(per_org) as hosts:
        work = Path(tmp)
        data = None
        if args.workload == "scale":
            from benchmarks.scale import write_data

            data = write_data(work, args.rows, args.features)
        for scheme in args.scheme:
            for profile in [None, *(PROFILES[p] for p in args.profile)]:
                runs.append(measure(args, hosts, scheme, profile, work, data))
    judge(runs, args.workload)
    shape = (f"{args.rows:,} x {args.features}, depth {args.depth}" if args.workload == "scale"
             else "default_credit (30,000 rows, 13 + 10 columns, depth 3)")
    report(runs, f"{shape}, {args.bits}-bit keys, {args.trees} tree(s) per run")
    if args.json:
        args.json.write_text(json.dumps({"workload": args.workload, "key_bits": args.bits,
                                         "trees": args.trees, "runs": runs}, indent=2) + "\n")


if __name__ == "__main__":
    main()
