"""A million customers: vertical SecureBoost at scale through the real system (issue 17).

    python -m benchmarks.scale --rows 1000000 --features 100 --trees 1 --depth 5 [--json FILE]
                               [--bits 2048] [--passive-helpers N] [--verbose] [--url amqp://...]
                               [--scheme paillier ou]

Goals on a 2-core machine at 1,000,000 x 100: PSI <= 3 min, <= 10 min per tree, <= 4 GB peak
RSS per party process.

The data are ``make_classification`` rows (seed 17), made and written in chunks so the
generator never holds the whole table: the guest (active, with the label) gets half the
features, the host (passive) the other half, each as a Parquet file of ``--rows`` rows. The
host's rows start 5% further along the customer numbers than the guest's, so each party holds
ids the other lacks and 95% of each party's ids are shared: PSI has real work. Each chunk is
its own ``make_classification`` draw (seed 17 + chunk), so its class clusters differ from the
next chunk's; the timing does not depend on that.

The run is the real system: one 'fedboost worker' per party over RabbitMQ (the host with
``--passive-helpers`` extra processes), and the SecureBoost Prefect flow in this process.
Seconds per step are Prefect task run times (as benchmarks.train reads them); peak RSS is each
worker process's VmHWM (and its children's: crypto pools), sampled from /proc every half
second, reported per process.

``--scheme paillier ou`` trains on the same data once per encryption scheme (``crypto.scheme``),
one after the other in the same run, and prints each scheme's seconds per tree against the
first's.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import yaml

from benchmarks.rabbitmq import start_workers
from benchmarks.train import JOB_STEPS, TREE_STEPS, step_seconds
from crypto.bin_products import kernel
from fedboost import _prefect_env
from fedboost.local_workers import stop_workers
from messages.rabbit_queues import delete_party_queues
from messages.signing import write_key_pair

log = logging.getLogger("benchmarks.scale")
SEED = 17
CHUNK_ROWS = 50_000
"""Rows generated and written at a time: a chunk of 100 float64 features is 40 MB."""
SHARED = 0.95
"""Share of each party's ids the other party also holds."""


def write_data(folder: Path, rows: int, features: int, seed: int = SEED,
               chunk_rows: int = CHUNK_ROWS) -> dict[str, Path]:
    """The guest's (id, y, x0..) and the host's (id, x..) Parquet files, ``rows`` rows each:
    customers 0..rows-1 at the guest, shift..shift+rows-1 at the host."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    from sklearn.datasets import make_classification

    half = features // 2
    shift = rows - int(round(rows * SHARED))
    files = {"guest": folder / "guest.parquet", "host": folder / "host.parquet"}
    guest_schema = pa.schema([("id", pa.string()), ("y", pa.int8())]
                             + [(f"x{j}", pa.float32()) for j in range(half)])
    host_schema = pa.schema([("id", pa.string())]
                            + [(f"x{j}", pa.float32()) for j in range(half, features)])
    with pq.ParquetWriter(files["guest"], guest_schema) as guest, \
            pq.ParquetWriter(files["host"], host_schema) as host:
        for k, start in enumerate(range(0, rows + shift, chunk_rows)):
            stop = min(start + chunk_rows, rows + shift)
            x, y = make_classification(n_samples=stop - start, n_features=features,
                                       n_informative=max(2, features // 5),
                                       n_redundant=features // 5, random_state=seed + k)
            x = x.astype(np.float32)
            ids = np.array([f"c{i:08d}" for i in range(start, stop)])
            at_guest = np.arange(start, stop) < rows
            at_host = np.arange(start, stop) >= shift
            if at_guest.any():
                guest.write_table(pa.table(
                    [pa.array(ids[at_guest]), pa.array(y[at_guest].astype(np.int8))]
                    + [pa.array(x[at_guest, j]) for j in range(half)], schema=guest_schema))
            if at_host.any():
                host.write_table(pa.table(
                    [pa.array(ids[at_host])]
                    + [pa.array(x[at_host, j]) for j in range(half, features)],
                    schema=host_schema))
    return files


def job_file(work: Path, files: dict[str, Path], tag: str, url: str, args: argparse.Namespace,
             scheme: str = "paillier") -> tuple[Path, list[str]]:
    """The job (also each party's worker configuration), its signing keys, and its parties."""
    guest, host = f"guest{tag}", f"host{tag}"
    policy = {"min_key_bits": min(args.bits, 2048),  # tiny test runs use 1024-bit keys
              "min_ou_key_bits": min(args.bits, 2048)}
    raw: dict[str, Any] = {
        "job": f"scale-{tag}", "protocol": "vertical_secureboost",
        "parties": {guest: {"role": "active", "data": str(files["guest"]), "id": "id",
                            "label": "y", "policy": policy},
                    host: {"role": "passive", "data": str(files["host"]), "id": "id",
                           "policy": policy}},
        "params": {"n_trees": args.trees, "max_depth": args.depth, "learning_rate": 0.1,
                   "max_bin": 32, "objective": "binary", "reg_lambda": 1.0, "seed": 0},
        "crypto": {"key_bits": args.bits, "scheme": scheme}, "validation": {"fraction": 0.0, "seed": 0},
        "transport": {"kind": "rabbitmq", "url": url},
        "signing": {"key_dir": str(work / "keys")}}
    for name in (guest, host, "flow"):
        write_key_pair(work / "keys", name)
    path = work / f"job-{tag}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path, [guest, host]


class RssTracer:
    """Peak RSS (VmHWM) and CPU seconds of each worker process and its children, from /proc.

    Labels: the party for a one-process worker; ``party-k`` for each process of a worker with
    several (``party/launcher`` starts them); ``.../children`` is the largest of a process's
    children (crypto and PSI pools), which come and go.
    """

    def __init__(self, roots: dict[str, tuple[int, int]], every: float = 0.5,
                 show_every: float = 0.0) -> None:
        """``roots``: per party, its worker's pid and how many processes it starts;
        ``show_every``: log the current RSS of each process that often (0: never)."""
        self.roots, self.every, self.show_every = roots, every, show_every
        self.now: dict[str, int] = {}
        self._shown = 0.0
        self.peak: dict[str, int] = {}
        self.cpu: dict[tuple[str, int], float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-tracer", daemon=True)
        self._tick = os.sysconf("SC_CLK_TCK")

    def __enter__(self) -> RssTracer:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.now = {}
            self.sample()
            if self.show_every and time.monotonic() - self._shown >= self.show_every:
                self._shown = time.monotonic()
                log.info("RSS now: %s", ", ".join(f"{label} {rss / 2 ** 30:.2f} GB"
                                                  for label, rss in sorted(self.now.items())))

    def sample(self) -> None:
        """Read every process of the tree once."""
        children = _children_by_parent()
        for party, (pid, processes) in self.roots.items():
            if processes == 1:
                self._process(party, pid, children)
                continue
            self._note(f"{party}/launcher", pid)  # its children serve; theirs are pools
            served = [c for c in sorted(children.get(pid, [])) if not _is_tracker(c)]
            for k, child in enumerate(served):
                self._process(f"{party}-{k}", child, children)

    def _process(self, label: str, pid: int, children: dict[int, list[int]]) -> None:
        self._note(label, pid)
        for child in children.get(pid, []):
            self._note(f"{label}/children", child)

    def _note(self, label: str, pid: int) -> None:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return  # it ended between listing and reading
        kb = {line.split(":")[0]: int(line.split()[1]) for line in status.splitlines()
              if line.startswith(("VmHWM:", "VmRSS:"))}
        hwm = kb.get("VmHWM", 0) * 1024
        self.now[label] = max(self.now.get(label, 0), kb.get("VmRSS", 0) * 1024)
        self.peak[label] = max(self.peak.get(label, 0), hwm)
        cpu = (int(fields[11]) + int(fields[12])) / self._tick  # utime + stime
        self.cpu[label, pid] = max(self.cpu.get((label, pid), 0.0), cpu)

    def cpu_seconds(self) -> dict[str, float]:
        """CPU seconds per label (children's summed over every child seen)."""
        out: dict[str, float] = {}
        for (label, _), seconds in self.cpu.items():
            out[label] = out.get(label, 0.0) + seconds
        return out


def _is_tracker(pid: int) -> bool:
    """Whether ``pid`` is multiprocessing's resource tracker (a spawn context starts one)."""
    try:
        return b"resource_tracker" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True


def _children_by_parent() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    return children


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Generate the data, then train once per scheme (``--scheme``); the first scheme's
    numbers, with every scheme's seconds per tree under ``by_scheme``."""
    started = time.perf_counter()
    files = write_data(work, args.rows, args.features)
    made = time.perf_counter() - started
    runs = {scheme: train(args, work, files, scheme) for scheme in args.scheme}
    numbers = {**runs[args.scheme[0]], "data_seconds": made}
    if len(runs) > 1:
        numbers["by_scheme"] = {scheme: {"tree_seconds": r["tree_seconds"],
                                         "psi_seconds": r["psi_seconds"],
                                         "steps": r["steps"],
                                         "steps_by_depth": r["steps_by_depth"],
                                         "cpu_seconds": r["cpu_seconds"]}
                                for scheme, r in runs.items()}
    return numbers


def train(args: argparse.Namespace, work: Path, files: dict[str, Path],
          scheme: str) -> dict[str, Any]:
    """Train over RabbitMQ under ``scheme`` and gather the numbers."""
    from flows.config import load_config
    from flows.secureboost import vertical_secureboost

    made = 0.0
    tag = uuid.uuid4().hex[:6]
    path, (guest, host) = job_file(work, files, tag, args.url, args, scheme)
    processes = {guest: 1, host: 1 + args.passive_helpers}
    procs = start_workers(path, work / "models", work, processes,
                          log_level="INFO" if args.verbose else "WARNING")
    try:
        with RssTracer({"guest": (procs[0].pid, 1), "host": (procs[1].pid, processes[host])},
                       show_every=5.0 if args.verbose else 0.0) as tracer:
            state = vertical_secureboost(load_config(path), return_state=True)
            result = state.result()
    finally:
        stop_workers(procs)
        delete_party_queues(args.url, [guest, host])
    steps = step_seconds(state.state_details.flow_run_id)
    by_depth = step_seconds(state.state_details.flow_run_id, by_depth=True)
    return {"rows": args.rows, "features": args.features, "key_bits": args.bits, "scheme": scheme,
            "passive_helpers": args.passive_helpers, "data_seconds": made,
            "bin_products": kernel(), "n_train": result["n_train"],
            "psi_seconds": steps.get("align-entities", 0.0),
            "tree_seconds": result["tree_seconds"], "steps": steps,
            "steps_by_depth": {k: v for k, v in by_depth.items() if "-d" in k},
            "peak_rss_bytes": dict(sorted(tracer.peak.items())),
            "cpu_seconds": dict(sorted(tracer.cpu_seconds().items()))}


def report(numbers: dict[str, Any]) -> None:
    """Print the run's numbers against the goals."""
    trees = numbers["tree_seconds"]
    print(f"\n{numbers['rows']:,} rows x {numbers['features']} features per id, "
          f"{numbers['key_bits']}-bit keys, {numbers['n_train']:,} aligned rows, host with "
          f"{numbers['passive_helpers']} helper process(es); data made in "
          f"{numbers['data_seconds']:.1f} s; bin products in {numbers['bin_products']}")
    print(f"PSI (align-entities): {numbers['psi_seconds']:.1f} s   (goal <= 180 s)")
    print("seconds per tree: " + ", ".join(f"{t:.1f}" for t in trees)
          + f"   (goal <= 600 s; mean {sum(trees) / len(trees):.1f})")
    print("seconds by step (Prefect task run times, summed over trees)")
    for step in JOB_STEPS + TREE_STEPS:
        print(f"  {step:<26}{numbers['steps'].get(step, 0.0):>10.2f}")
    for step, seconds in sorted(numbers["steps_by_depth"].items()):
        print(f"    {step:<24}{seconds:>10.2f}")
    print("peak RSS (VmHWM) and CPU seconds per process   (goal <= 4 GB per party process)")
    for label, peak in numbers["peak_rss_bytes"].items():
        print(f"  {label:<26}{peak / 2 ** 30:>8.3f} GB{numbers['cpu_seconds'].get(label, 0):>10.1f}"
              f" s CPU")
    schemes = numbers.get("by_scheme", {})
    if schemes:
        first = next(iter(schemes.values()))["tree_seconds"]
        base = sum(first) / len(first)
        print("encryption schemes, same data, one after the other (peak RSS above: the first)")
        for scheme, r in schemes.items():
            mean = sum(r["tree_seconds"]) / len(r["tree_seconds"])
            print(f"  {scheme:<10} {mean:>8.1f} s/tree  {base / mean:>5.2f}x the first's speed; "
                  f"PSI {r['psi_seconds']:.1f} s; CPU s per process "
                  + ", ".join(f"{k} {v:.0f}" for k, v in r["cpu_seconds"].items()))
            for step in TREE_STEPS:
                print(f"    {step:<24}{r['steps'].get(step, 0.0):>10.2f}")
            for step, seconds in sorted(r["steps_by_depth"].items()):
                if step.startswith(("build-histograms", "apply-splits")):  # builds ahead
                    print(f"    {step:<24}{seconds:>10.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows per party")
    parser.add_argument("--features", type=int, default=100, help="features in all (half each)")
    parser.add_argument("--trees", type=int, default=1)
    parser.add_argument("--depth", type=int, default=5)
    parser.add_argument("--bits", type=int, default=2048)
    parser.add_argument("--passive-helpers", type=int, default=1,
                        help="extra host processes sharing its histogram work (default 1)")
    parser.add_argument("--url", default=os.environ.get(
        "FEDBOOST_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2F"))
    parser.add_argument("--work", type=Path, help="folder for data, keys and models "
                        "(default: a temporary one, removed after)")
    parser.add_argument("--scheme", nargs="+", choices=["paillier", "ou"], default=["paillier"],
                        help="encryption schemes (crypto.scheme), one run each on the same data")
    parser.add_argument("--json", type=Path, help="write the numbers to this file")
    parser.add_argument("--verbose", action="store_true",
                        help="workers and Prefect log at INFO (PSI progress, steps)")
    args = parser.parse_args()
    if args.rows < 100 or args.features < 2 or args.passive_helpers < 0:
        parser.error("--rows >= 100, --features >= 2, --passive-helpers >= 0")
    _prefect_env.configure()
    level = logging.INFO if args.verbose else logging.WARNING
    for name in ("prefect", "prefect.task_runs", "prefect.flow_runs"):
        logging.getLogger(name).setLevel(level)
    logging.basicConfig(format="%(asctime)s %(name)s %(message)s")
    log.setLevel(level)
    if args.work:
        args.work.mkdir(parents=True, exist_ok=True)
        numbers = run(args, args.work.resolve())
    else:
        with tempfile.TemporaryDirectory(prefix="fedboost-scale-") as tmp:
            numbers = run(args, Path(tmp))
    report(numbers)
    if args.json:
        args.json.write_text(json.dumps(numbers, indent=2) + "\n")


if __name__ == "__main__":
    main()
