"""A new user's first hour, run the way a user runs it: the README's API example saved to a
file and piped to Python, a bad data file, an unreachable broker, a worker that stops mid-job.
Each drives the real command or interpreter in its own process."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.scenarios import CONFIGS, DATA, REPO

FEDBOOST = [sys.executable, "-m", "fedboost.cli"]


def _env() -> dict[str, str]:
    env = {**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    env.pop("PREFECT_API_URL", None)
    env.pop("PYTHONPATH", None)  # what the user's interpreter imports, nothing more
    return env


def _light_breast(folder: Path, n_trees: int = 3, **changes: object) -> Path:
    """configs/breast.yaml with absolute data paths, 1024-bit keys and fewer trees."""
    raw = yaml.safe_load((CONFIGS / "breast.yaml").read_text())
    for party in raw["parties"].values():
        party["data"] = str((CONFIGS / party["data"]).resolve())
    raw["crypto"]["key_bits"] = 1024
    raw["params"]["n_trees"] = n_trees
    raw.update(changes)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "breast.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


_LIGHTER = """
def _lighter(path):  # the test's: the checkout's job file with 1024-bit keys and 3 trees
    import yaml
    raw = yaml.safe_load(path.read_text())
    for party in raw["parties"].values():
        party["data"] = str((path.parent / party["data"]).resolve())
    raw["crypto"]["key_bits"], raw["params"]["n_trees"] = 1024, 3
    return raw
"""


def test_the_readme_api_example_runs_as_a_script_and_piped(tmp_path: Path) -> None:
    """Saved to a file (no __main__ guard) and run from a folder outside the checkout, beside
    a checkout named 'fedboost' (no configs/ there: the example finds the checkout's job file),
    then piped to 'python -': it trains, predicts and reports, and prints only what it prints
    itself (no Prefect lines, no traceback). The job file the example finds is lightened on
    the way (fewer trees, smaller keys): the code around it runs as the README has it."""
    readme = (REPO / "README.md").read_text()
    code = re.search(r"```python\n(.*?)```", readme[readme.index("## Python API"):], re.S)
    assert code is not None and "__main__" not in code.group(1)
    named = 'checkout / "configs/breast.yaml"'
    assert named in code.group(1)
    lighter = _LIGHTER + code.group(1).replace(named, f"_lighter({named})")
    (tmp_path / "example.py").write_text(lighter)
    (tmp_path / "fedboost").symlink_to(REPO)  # 'git clone ... fedboost' beside the script
    as_file = subprocess.run([sys.executable, "example.py"], cwd=tmp_path, env=_env(),
                             capture_output=True, text=True, timeout=600)
    assert as_file.returncode == 0, as_file.stderr
    assert "valid_auc" in as_file.stdout and (tmp_path / "runs/breast/scores.csv").is_file()
    assert as_file.stderr == "", as_file.stderr
    piped = subprocess.run([sys.executable, "-"], input=lighter, cwd=tmp_path, env=_env(),
                           capture_output=True, text=True, timeout=600)
    assert piped.returncode == 0, piped.stderr
    assert piped.stderr == "", piped.stderr
    assert piped.stdout.splitlines()[0] == as_file.stdout.splitlines()[0]  # the same metrics


@pytest.mark.parametrize("problem", ["missing file", "text column", "label 2"])
def test_a_bad_data_file_answers_in_seconds(tmp_path: Path, problem: str) -> None:
    """Checked before Prefect and the workers start (they take tens of seconds on a busy
    machine): one line, in seconds (under 8 s with the interpreter's start); a label a binary job cannot have among them, named by
    row like the rest (not after PSI and binning)."""
    party = "guest" if problem == "label 2" else "host"
    bad = tmp_path / f"{party}.csv"
    if problem != "missing file":
        lines = (DATA / f"breast_hetero_{party}.csv").read_text().splitlines()
        cells = lines[700 if len(lines) > 700 else 40].split(",")
        if problem == "label 2":
            cells[lines[0].split(",").index("y")] = "2"
        else:
            cells[2] = "high"
        lines[40] = ",".join(cells)
        bad.write_text("\n".join(lines) + "\n")
    job = _light_breast(tmp_path)
    raw = yaml.safe_load(job.read_text())
    raw["parties"][party]["data"] = str(bad)
    job.write_text(yaml.safe_dump(raw))
    started = time.monotonic()
    done = subprocess.run([*FEDBOOST, "train", str(job), "--out", str(tmp_path / "run")],
                          cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=120)
    took = time.monotonic() - started
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1 and done.stderr.startswith(
        f"fedboost: error: party {party}")
    assert ("not found" if problem == "missing file" else "row 41") in done.stderr
    if problem == "label 2":
        assert "label column 'y': 2 is not 0 or 1 (objective binary)" in done.stderr
    # the process's start and imports take 2-5 s on a busy machine; the workers and Prefect's
    # server, tens of seconds more, must not have started (the label 2 took 57.8 s before)
    assert took < 8, f"{problem}: {took:.1f} s"


def test_an_unreachable_broker_is_one_line_per_attempt_and_ctrl_c_one_line(
        tmp_path: Path) -> None:
    """No pika lines, no tracebacks: where it tried, why, what to check; Ctrl-C: one line."""
    from tests.conftest import _free_port

    port = _free_port()  # nothing listens there
    subprocess.run([*FEDBOOST, "keys", "--out", str(tmp_path / "keys"), "--name", "host"],
                   check=True, capture_output=True, env=_env())
    worker = tmp_path / "host.yaml"
    worker.write_text(yaml.safe_dump({
        "party": "host", "data": str(DATA / "breast_hetero_host.csv"),
        "transport": {"kind": "rabbitmq", "url": f"amqp://fedboost@127.0.0.1:{port}/%2F",
                      "password_file": "broker.pw"},
        "signing": {"key_dir": str(tmp_path / "keys")}}))
    (tmp_path / "broker.pw").write_text("unused\n")
    (tmp_path / "broker.pw").chmod(0o600)
    env = _env()
    # as started at a terminal: a test run launched in the background ('make test &') hands
    # its children SIGINT ignored, and Python then keeps it ignored (as nohup wants)
    proc = subprocess.Popen([*FEDBOOST, "worker", "--party", "host", "--config", str(worker)],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, preexec_fn=_default_sigint)
    # attempts at about 0, 0.5, 1.5 and 3.5 s after start-up, which takes seconds on a busy
    # machine: interrupt once two attempts are printed, not after a fixed sleep
    lines: list[str] = []
    deadline = time.monotonic() + 90
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line.rstrip("\n"))
        if sum("cannot reach the broker" in seen for seen in lines) >= 2:
            break
    proc.send_signal(signal.SIGINT)
    rest, _ = proc.communicate(timeout=30)
    lines += rest.splitlines()
    out = "\n".join(lines)
    assert proc.returncode == 130, out
    assert lines[-1] == "fedboost: interrupted" and "Traceback" not in out, out
    attempts = [line for line in lines if "cannot reach the broker" in line]
    assert 2 <= len(attempts) <= 6 and len(lines) <= len(attempts) + 2, out
    assert all(f"at 127.0.0.1:{port} (connection refused)" in a and "is RabbitMQ running" in a
               for a in attempts), out


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _processes_named(name: str) -> list[int]:
    pids = []
    for comm in Path("/proc").glob("[0-9]*/comm"):
        try:
            if comm.read_text().strip() == name:
                pids.append(int(comm.parent.name))
        except OSError:
            continue
    return pids


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="names processes with prctl")
def test_a_silent_worker_is_named_and_a_dead_one_ends_the_run(tmp_path: Path) -> None:
    """Freeze the host's worker mid-run: within 30 s (and the start-up) the run's lines say
    it waits for host, on which step, since when; kill it: the run ends at once with one line
    naming the party, not after the step timeout (an hour by default)."""
    tag = f"h{os.getpid() % 100000}"  # its process name, fb-<party>, tells it from others'
    job = _light_breast(tmp_path, n_trees=40)
    raw = yaml.safe_load(job.read_text())
    raw["parties"][tag] = raw["parties"].pop("host")
    job.write_text(yaml.safe_dump(raw))
    proc = subprocess.Popen([*FEDBOOST, "train", str(job), "--out", str(tmp_path / "run")],
                            cwd=tmp_path, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        killed, err = _freeze_then_kill(proc, tag)
    finally:
        proc.kill()  # whatever failed: its workers die with it
    assert time.monotonic() - killed < 60  # seconds (about 10 on a quiet machine), not an hour
    assert proc.returncode == 1 and "Traceback" not in err, err
    assert err.splitlines()[-2].startswith(
        f"fedboost: error: party {tag}: its worker process was killed by signal SIGKILL while "
        f"the flow waited for "), err
    # every party checkpointed tree 0 at least: the line that continues the job follows
    assert re.fullmatch(rf"fedboost: the parties keep their checkpoints: 'fedboost resume "
                        rf"breast --out {re.escape(str(tmp_path / 'run'))}' continues after "
                        rf"tree \d+", err.splitlines()[-1]), err


def _freeze_then_kill(proc: subprocess.Popen[str], tag: str) -> tuple[float, str]:
    """Stop party ``tag``'s worker after the first tree, check the waiting line, kill it;
    returns when it was killed and the run's stderr."""
    assert proc.stdout is not None and proc.stderr is not None
    for line in proc.stdout:
        if line.startswith("trees 1/40 "):
            break
    else:
        pytest.fail(f"no tree finished: {proc.wait()} {proc.stderr.read()}")
    (host,) = _processes_named(f"fb-{tag}")
    os.kill(host, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        for line in proc.stdout:
            if line.startswith("waiting "):
                break
        took = time.monotonic() - stopped
        assert re.fullmatch(r"waiting \d+ s \(since \d\d:\d\d:\d\d\) for [\w, ]+ to answer "
                            rf"\w+ \(tree \d+(, depth \d+)?\)(; .*)?; {tag}: its worker "
                            r"process is stopped\n", line), line
        assert took < 60, took  # 30 s, and the load of a busy machine
    finally:
        os.kill(host, signal.SIGKILL)
    killed = time.monotonic()
    _, err = proc.communicate(timeout=120)
    return killed, err


def _read_until(fd: int, wanted: bytes, seconds: float, seen: bytearray) -> bool:
    """Read a pty into ``seen`` until ``wanted`` shows or ``seconds`` pass (False) or it
    closes."""
    import select

    deadline = time.monotonic() + seconds
    while wanted not in seen:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            continue
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # the other side closed
            return wanted in seen
        if not chunk:
            return wanted in seen
        seen.extend(chunk)
    return True


def test_ctrl_c_at_the_terminal_ends_train_at_once_with_the_resume_line(tmp_path: Path) -> None:
    """Ctrl-C typed at a terminal (a pty: the progress bar is on) reaches the command, its
    workers and Prefect's server alike: the command returns 130 within seconds with one line
    naming the resume command, and nothing of Prefect's crash handling shows over the bar."""
    import pty

    job = _light_breast(tmp_path, n_trees=40)
    pid, fd = pty.fork()
    if pid == 0:  # the child: a session leader with the pty as its terminal
        os.chdir(tmp_path)
        os.execve(sys.executable, [*FEDBOOST, "train", str(job), "--out", "run"], _env())
    seen = bytearray()
    try:
        assert _read_until(fd, b"trees 2/40", 300, seen), seen.decode(errors="replace")
        typed = time.monotonic()
        os.write(fd, b"\x03")  # the terminal's interrupt character: SIGINT to the group
        _read_until(fd, b"\x00never", 60, seen)  # all it prints, until it closes the pty
        _, status = os.waitpid(pid, 0)
        took = time.monotonic() - typed
    finally:
        os.close(fd)
    text = seen.decode(errors="replace")
    assert os.waitstatus_to_exitcode(status) == 130, text
    assert re.search(r"fedboost: interrupted; the parties keep their checkpoints: 'fedboost "
                     r"resume breast --out run' continues after tree \d+", text), text
    for noise in ("Crash detected", "Error logging to API", "Traceback", "KeyboardInterrupt"):
        assert noise not in text, text
    assert took < 15, took  # about 5 s on a busy 2-core machine (load 16)


def test_a_second_worker_on_a_party_s_queue_says_so_at_start(tmp_path: Path,
                                                              rabbit_url: str) -> None:
    """README step 5 on a broker someone else uses: a worker whose party's queue already has
    a consumer (another worker of that name on the same vhost) says so in one WARNING line
    naming the queue and what to do; the first worker said nothing of the kind."""
    import pika

    party = f"w{os.getpid()}x{time.monotonic_ns() % 100000}"
    subprocess.run([*FEDBOOST, "keys", "--out", str(tmp_path / "keys"), "--name", party],
                   check=True, capture_output=True, env=_env())
    user, _, rest = rabbit_url.removeprefix("amqp://").partition(":")
    password, _, where = rest.partition("@")
    (tmp_path / "broker.pw").write_text(password + "\n")
    (tmp_path / "broker.pw").chmod(0o600)
    config = tmp_path / "worker.yaml"
    config.write_text(yaml.safe_dump({
        "party": party, "data": str(DATA / "breast_hetero_host.csv"),
        "transport": {"kind": "rabbitmq", "url": f"amqp://{user}@{where}",
                      "password_file": "broker.pw"},
        "signing": {"key_dir": str(tmp_path / "keys")}}))
    command = [*FEDBOOST, "worker", "--party", party, "--config", str(config)]
    workers, seen = [], []
    try:
        for _ in range(2):
            worker = subprocess.Popen(command, cwd=tmp_path, env=_env(), text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            workers.append(worker)
            seen.append("")
            assert worker.stdout is not None
            for line in worker.stdout:  # up once it says what it serves
                seen[-1] += line
                if " serving " in line:
                    break
        for worker in workers:
            worker.terminate()
        first, second = (text + w.communicate(timeout=60)[0] for text, w in zip(seen, workers))
    finally:
        for worker in workers:
            worker.kill()
        connection = pika.BlockingConnection(pika.URLParameters(rabbit_url))
        connection.channel().queue_delete(f"fedboost.{party}")
        connection.close()
    assert "already has" not in first
    warned = [line for line in second.splitlines() if " WARNING " in line]
    assert len(warned) == 1 and f"queue fedboost.{party} already has 1 other consumer(s)" in \
        warned[0] and "give yours a vhost of its own" in warned[0], second
