"""Vertical SecureBoost with the organisations on hosts of their own, over a WAN (issue 38).

    python -m benchmarks.wan [--profile lan 100mbit-50ms 10mbit-50ms] [--scheme paillier ou]
                             [--trees 10] [--bits 2048] [--workload default_credit|scale]
                             [--rows 1000000 --features 100 --depth 5] [--json FILE]

The topology is ``deploy/netns-federation.sh``'s (this benchmark's own prefix and /24): the
lender (guest) runs the broker in its own namespace, its worker beside it and the flow in this
process (the root namespace, over the bridge: the lender's LAN); the data provider (host) runs
its worker in a namespace of its own, whose link to the bridge is rate-limited by ``tc tbf`` and
whose AMQP connections cross ``benchmarks.wan_relay`` (in the host's namespace, in front of the
lender's broker) for the one-way delay. So every message between the organisations crosses the
WAN once, as it will between two organisations' brokers; the lender's own traffic stays on its
LAN. Profiles (``benchmarks.wan_relay.PROFILES``): ``lan`` (the relay, no delay, no limit),
``1gbit-5ms``, ``100mbit-50ms`` (SecretFlow's SGB setting), ``10mbit-50ms``; the delay is one way.

``loopback`` is the baseline measured in the same run: the same broker, both workers in this
namespace (no relay, no limit). Per scheme the runs go loopback first, then the profiles.

Per profile and scheme (means over the trees): s/tree; bytes per tree each way (counted at the
relay: ``up`` from the data provider, ``down`` to it); turns per tree (messages going up after
messages came down: request/answer pairs between the organisations that waited a round trip,
``wan_relay.turns``); and where a tree's time goes: ``steps`` (inside the flow's Prefect tasks:
computing and messaging), of which ``wire`` is what the profile adds over loopback's steps, and
``flow`` (between the tasks: the flow's own orchestration). ``floor`` is the wire's least cost:
turns x the round trip + the busier direction's bytes / the rate. The goal column is
s/tree <= 1.25 x max(loopback s/tree, bytes per tree / rate).

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
import subprocess
import tempfile
import uuid
from pathlib import Path
from typing import Any

import yaml

from benchmarks.rabbitmq import _job
from benchmarks.train import task_runs
from benchmarks.wan_relay import PROFILES, Profile, start_relay, turns
from fedboost import _prefect_env
from flows.broker_settings import AMQP_URL_ENV
from fedboost.local_workers import FEDBOOST, start_worker, stop_workers, worker_env
from messages.rabbit_queues import delete_party_queues

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "deploy" / "netns-federation.sh"
RELAY_PORT = 5673
log = logging.getLogger("benchmarks.wan")


class Hosts:
    """``netns-federation.sh`` under this run's own prefix: the guest's namespace with a broker,
    the host's without; the bridge's .1 this process's."""

    def __init__(self) -> None:
        self.prefix = f"fbw{uuid.uuid4().hex[:3]}"
        net = f"10.231.{int(self.prefix.encode().hex(), 16) % 254 + 1}"
        self.env = {**os.environ, "FEDBOOST_NETNS_PREFIX": self.prefix, "FEDBOOST_NETNS_NET": net,
                    "FEDBOOST_NETNS_DIR": f"/run/fedboost-netns-{self.prefix}"}
        self.hosts: dict[str, list[str]] = {}

    def script(self, *args: str) -> str:
        done = subprocess.run(["bash", str(SCRIPT), *args], env=self.env, capture_output=True,
                              text=True, timeout=300)
        if done.returncode != 0:
            raise RuntimeError(f"netns-federation.sh {args[0]}: {done.stderr.strip()}")
        return done.stdout

    def __enter__(self) -> Hosts:
        try:
            self.script("up", "--orgs", "guest", "--machines", "host", "--bridge-address")
            for line in self.script("env").splitlines():
                name, _, namespace, address, *password = line.split()
                self.hosts[name] = [namespace, address, *password]
        except BaseException:
            self.script("down")
            raise
        return self

    def __exit__(self, *_: object) -> None:
        self.script("down")

    def namespace(self, name: str) -> list[str]:
        return ["ip", "netns", "exec", self.hosts[name][0]]

    @property
    def broker(self) -> str:
        _, address, password = self.hosts["guest"]
        return f"amqp://guest:{password}@{address}:5672/%2F"

    @property
    def broker_in_job(self) -> str:
        """The broker's URL for the job file, without the password (which reaches the flow and
        the workers as ``FEDBOOST_AMQP_URL``, so Prefect never stores it)."""
        _, address, _ = self.hosts["guest"]
        return f"amqp://guest@{address}:5672/%2F"

    def shape(self, profile: Profile) -> None:
        self.script("shape", "host", profile.rate or "off", profile.burst)


def tree_windows(flow_run_id: object) -> dict[int, dict[str, float]]:
    """Per tree: the wall clock its first task started and its last ended, and the time inside
    its tasks (their union: tasks that overlap count once)."""
    import re

    spans: dict[int, list[tuple[float, float]]] = {}
    for run in task_runs(flow_run_id):
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
             data: dict[str, Path] | None) -> tuple[Path, list[str]]:
    """This run's job (its own parties and queues) over the broker at ``url``."""
    tag = uuid.uuid4().hex[:6]
    if args.workload == "scale":
        from benchmarks.scale import job_file as scale_job

        assert data is not None
        return scale_job(work, data, tag, url, args, scheme)
    raw = _job(tag, url, args.bits, args.trees, work / "keys")
    for party in raw["parties"].values():
        party["policy"]["min_ou_key_bits"] = min(args.bits, 2048)
    raw["crypto"]["scheme"] = scheme
    path = work / f"job-{tag}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path, list(raw["parties"])


def measure(args: argparse.Namespace, hosts: Hosts, scheme: str, profile: Profile | None,
            work: Path, data: dict[str, Path] | None) -> dict[str, Any]:
    """One training run: ``profile`` None is the loopback baseline."""
    from flows.config import load_config
    from flows.secureboost import vertical_secureboost

    url = hosts.broker
    path, (guest, host) = job_file(args, work, hosts.broker_in_job, scheme, data)
    record = work / f"relay-{uuid.uuid4().hex[:6]}.json"
    relay, host_url = None, url
    procs = []
    load_before = os.getloadavg()
    try:
        if profile is not None:
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
        if relay is not None:
            relay.terminate()
            relay.wait(timeout=60)
        if profile is not None:
            hosts.shape(PROFILES["lan"])
        delete_party_queues(url, [guest, host])
    if any(codes):
        raise RuntimeError(f"workers exited {codes}: {(work / f'{host}.log').read_text()[-2000:]}")
    load_after = os.getloadavg()
    windows = tree_windows(state.state_details.flow_run_id)
    chunks = json.loads(record.read_text())["chunks"] if relay is not None else []
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
    return numbers


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
    parser.add_argument("--json", type=Path)
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
    with tempfile.TemporaryDirectory(prefix="fedboost-wan-") as tmp, Hosts() as hosts:
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
