"""The fedboost command as a user runs it: real processes, real files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.scenarios import CONFIGS, DATA

FEDBOOST = [sys.executable, "-m", "fedboost.cli"]


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    env.pop("PREFECT_API_URL", None)
    return subprocess.run([*FEDBOOST, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600)


def _config(tmp_path: Path, guest: Path, host: Path, **extra: object) -> Path:
    raw = yaml.safe_load((CONFIGS / "breast.yaml").read_text())
    raw["parties"]["guest"]["data"] = str(guest)
    raw["parties"]["host"]["data"] = str(host)
    raw["crypto"]["key_bits"] = 1024
    raw["params"]["n_trees"] = 3
    raw.update(extra)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _edited(tmp_path: Path, name: str, edit) -> Path:  # type: ignore[no-untyped-def]
    lines = (DATA / name).read_text().splitlines()
    out = tmp_path / f"edited_{name}"
    out.write_text("\n".join(edit(lines)) + "\n")
    return out


def test_train_predict_centralized(tmp_path: Path) -> None:
    config = _config(tmp_path, DATA / "breast_hetero_guest.csv", DATA / "breast_hetero_host.csv")
    done = _run("train", str(config), "--out", str(tmp_path / "run"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    # not a terminal: plain progress lines, one per stage step and per tree, no escapes
    lines = done.stdout.splitlines()
    assert "PSI: psi_blind" in lines and "binning: bin_features" in lines, done.stdout
    trees = [line for line in lines if line.startswith("trees ")]
    assert [t.split()[1] for t in trees] == ["1/3", "2/3", "3/3"], done.stdout
    assert all(" s/tree  ETA " in t and "train_auc=" in t for t in trees), trees
    assert "\x1b[" not in done.stdout
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["n_aligned"] == 569 and metrics["n_valid"] == 171
    assert {"train_auc", "valid_auc", "train_seconds", "tree_seconds"} <= set(metrics)
    assert len(metrics["tree_seconds"]) == 3
    assert (tmp_path / "run" / "guest" / "model.json").is_file()
    assert (tmp_path / "run" / "host" / "lookup.json").is_file()
    assert not (tmp_path / "run" / "host" / "model.json").exists()

    scored = _run("predict", str(tmp_path / "run"), "--out", str(tmp_path / "scores.csv"),
                  cwd=tmp_path)
    assert scored.returncode == 0, scored.stderr
    lines = (tmp_path / "scores.csv").read_text().splitlines()
    assert lines[0] == "id,score,split" and len(lines) == 570
    # each training-file row says whether the model was trained on it or held it out
    splits = [line.rsplit(",", 1)[1] for line in lines[1:]]
    assert (splits.count("train"), splits.count("valid")) == (metrics["n_train"],
                                                               metrics["n_valid"])

    central = _run("centralized", str(config), "--out", str(tmp_path / "central"), cwd=tmp_path)
    assert central.returncode == 0, central.stderr
    cen = json.loads((tmp_path / "central" / "metrics.json").read_text())
    assert cen["train_auc"] == pytest.approx(metrics["train_auc"], abs=1e-9)
    assert cen["valid_auc"] == pytest.approx(metrics["valid_auc"], abs=1e-9)


def test_quiet_train_prints_only_the_result_and_log_level_brings_prefect_back(
        tmp_path: Path) -> None:
    config = _config(tmp_path, DATA / "breast_hetero_guest.csv", DATA / "breast_hetero_host.csv",
                     params={"n_trees": 2, "max_depth": 2})
    done = _run("train", str(config), "--out", str(tmp_path / "run"), "--quiet",
                "--log-level", "INFO", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1].startswith("trained 2 trees"), done.stdout
    assert len(done.stdout.splitlines()) == 1, done.stdout
    assert "tree 1 done (2/2)" in done.stderr  # the flow's own Prefect lines, at INFO


def _assert_one_error_line(done: subprocess.CompletedProcess[str], *expected: str) -> None:
    assert done.returncode == 1, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("fedboost: error:")]
    assert len(errors) == 1, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    for text in expected:
        assert text in errors[0], errors[0]


def test_missing_id_column(tmp_path: Path) -> None:
    host = _edited(tmp_path, "breast_hetero_host.csv",
                   lambda ls: [ls[0].replace("id,", "key,", 1), *ls[1:]])
    done = _run("train", str(_config(tmp_path, DATA / "breast_hetero_guest.csv", host)), cwd=tmp_path)
    _assert_one_error_line(done, "party host", str(host), "no id column 'id'")


def test_duplicate_ids(tmp_path: Path) -> None:
    guest = _edited(tmp_path, "breast_hetero_guest.csv", lambda ls: [*ls, ls[5]])
    done = _run("train", str(_config(tmp_path, guest, DATA / "breast_hetero_host.csv")), cwd=tmp_path)
    _assert_one_error_line(done, "party guest", str(guest), "duplicate id")


def test_non_numeric_feature(tmp_path: Path) -> None:
    def spoil(ls: list[str]) -> list[str]:
        cells = ls[10].split(",")
        cells[3] = "abc"
        return [*ls[:10], ",".join(cells), *ls[11:]]

    host = _edited(tmp_path, "breast_hetero_host.csv", spoil)
    done = _run("train", str(_config(tmp_path, DATA / "breast_hetero_guest.csv", host)), cwd=tmp_path)
    _assert_one_error_line(done, "party host", str(host), "row 11", "'x2'", "not a number")
    assert "abc" not in done.stdout + done.stderr  # the cell's value stays at the party


def test_empty_intersection(tmp_path: Path) -> None:
    host = _edited(tmp_path, "breast_hetero_host.csv",
                   lambda ls: [ls[0], *[f"other-{line}" for line in ls[1:]]])
    done = _run("train", str(_config(tmp_path, DATA / "breast_hetero_guest.csv", host)), cwd=tmp_path)
    _assert_one_error_line(done, "party guest", "empty intersection", "host")


def test_unknown_config_key(tmp_path: Path) -> None:
    config = _config(tmp_path, DATA / "breast_hetero_guest.csv", DATA / "breast_hetero_host.csv",
                     params={"n_trees": 3, "max_dept": 2})
    done = _run("train", str(config), cwd=tmp_path)
    _assert_one_error_line(done, str(config), "unknown key 'params.max_dept'")


def test_bad_config_value(tmp_path: Path) -> None:
    config = _config(tmp_path, DATA / "breast_hetero_guest.csv", DATA / "breast_hetero_host.csv",
                     params={"n_trees": 0})
    done = _run("train", str(config), cwd=tmp_path)
    _assert_one_error_line(done, "key 'params.n_trees'", "greater than or equal to 1")


def test_resume_refuses_a_job_name_that_leaves_runs(tmp_path: Path) -> None:
    planted = tmp_path / "elsewhere"
    planted.mkdir()
    (planted / "job.json").write_text("{}")
    (tmp_path / "runs").mkdir()
    done = _run("resume", "../elsewhere", cwd=tmp_path)
    _assert_one_error_line(done, "job '../elsewhere' is not a job name")


@pytest.mark.heavy
def test_killed_training_continues_when_run_again(tmp_path: Path) -> None:
    """The embedded default: kill the whole process group mid-run (workers included), run the
    same 'fedboost train' again: it continues after the last tree and ends with the model of an
    uninterrupted run."""
    import signal

    job = _config(tmp_path, DATA / "breast_hetero_guest.csv", DATA / "breast_hetero_host.csv")
    raw = yaml.safe_load(job.read_text())
    raw["params"]["n_trees"] = 8
    job.write_text(yaml.safe_dump(raw))
    whole = _run("train", str(job), "--out", str(tmp_path / "whole"), cwd=tmp_path)
    assert whole.returncode == 0, whole.stderr
    env = {**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    env.pop("PREFECT_API_URL", None)
    out = tmp_path / "cut"
    first = subprocess.Popen([*FEDBOOST, "train", str(job), "--out", str(out)], cwd=tmp_path,
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             start_new_session=True)
    assert first.stdout is not None
    for line in first.stdout:
        if line.startswith("trees 3/8 "):  # the progress line after tree 3's checkpoint
            os.killpg(first.pid, signal.SIGKILL)
            break
    first.wait(timeout=60)
    again = _run("train", str(job), "--out", str(out), cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "resumed after" in again.stdout
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["resumed_after"] >= 3 and metrics["trees_trained"] == 8 - metrics["resumed_after"]
    assert (out / "guest" / "model.json").read_bytes() == \
        (tmp_path / "whole" / "guest" / "model.json").read_bytes()
    assert (out / "host" / "lookup.json").read_bytes() == \
        (tmp_path / "whole" / "host" / "lookup.json").read_bytes()
    assert not (out / "guest" / "checkpoints").exists()  # a finished job keeps none


@pytest.mark.heavy
def test_ctrl_c_ends_in_one_line_naming_the_resume_command(tmp_path: Path) -> None:
    """SIGINT to the whole group, as a terminal's Ctrl-C: exit 130 with the command that
    continues the job, which then resumes after the finished trees."""
    import signal

    job = _config(tmp_path, DATA / "breast_hetero_guest.csv", DATA / "breast_hetero_host.csv")
    env = {**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    env.pop("PREFECT_API_URL", None)
    out = tmp_path / "run"
    first = subprocess.Popen([*FEDBOOST, "train", str(job), "--out", str(out)], cwd=tmp_path,
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             start_new_session=True)
    assert first.stdout is not None
    for line in first.stdout:
        if line.startswith("trees 1/3 "):
            os.killpg(first.pid, signal.SIGINT)
            break
    rest = first.stdout.read()
    assert first.wait(timeout=120) == 130, rest
    assert f"'fedboost resume breast --out {out}'" in rest, rest
    assert "KeyboardInterrupt" not in rest, rest  # the workers leave Ctrl-C to the command
    again = _run("resume", "breast", "--out", str(out), cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert json.loads((out / "metrics.json").read_text())["resumed_after"] >= 1


def test_keys_makes_one_identity(tmp_path: Path) -> None:
    """A party makes its own key: one --name, no 'flow' added; several only for a local trial."""
    done = _run("keys", "--out", str(tmp_path / "keys"), "--name", "host", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in (tmp_path / "keys").iterdir()) == ["host.key", "host.pub"]
    assert (tmp_path / "keys" / "host.key").stat().st_mode & 0o777 == 0o600
    assert "send host.pub" in done.stdout

    several = _run("keys", "--out", str(tmp_path / "all"), "--name", "guest", "--name", "host",
                   cwd=tmp_path)
    _assert_one_error_line(several, "--local-trial", "its own")
    assert not (tmp_path / "all").exists()

    trial = _run("keys", "--out", str(tmp_path / "all"), "--name", "guest", "--name", "host",
                 "--name", "flow", "--local-trial", cwd=tmp_path)
    assert trial.returncode == 0, trial.stderr
    assert sorted(p.name for p in (tmp_path / "all").iterdir()) == \
        sorted(f"{n}.{ext}" for n in ("guest", "host", "flow") for ext in ("key", "pub"))


def test_definitions_take_passwords_from_environment_and_files(tmp_path: Path) -> None:
    from fedboost.broker import check_password, password_env

    (tmp_path / "host.pw").write_text("host-secret-from-file\n")
    (tmp_path / "host.pw").chmod(0o600)
    env = {password_env("guest"): "guest-secret-from-env",
           password_env("flow"): "flow-secret-from-env"}
    out = tmp_path / "definitions.json"

    def definitions(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        full = {**os.environ, **extra}
        return subprocess.run([*FEDBOOST, "definitions", *args, "--out", str(out)], cwd=tmp_path,
                              env=full, capture_output=True, text=True, timeout=60)

    done = definitions("--party", "guest", "--party", f"host=@{tmp_path / 'host.pw'}", **env)
    assert done.returncode == 0 and "warning" not in done.stderr, done.stderr
    users = {u["name"]: u["password_hash"] for u in json.loads(out.read_text())["users"]}
    assert check_password(users["fedboost-guest"], "guest-secret-from-env")
    assert check_password(users["fedboost-host"], "host-secret-from-file")
    assert check_password(users["fedboost-flow"], "flow-secret-from-env")
    assert "secret" not in out.read_text()

    missing = definitions("--party", "guest", "--party", "host", **env)
    _assert_one_error_line(missing, "--party host", password_env("host"), "@FILE")

    literal = definitions("--party", "guest=typed-secret", "--party",
                          f"host=@{tmp_path / 'host.pw'}", **env)
    assert literal.returncode == 0, literal.stderr
    assert "--party guest: a password on the command line shows in ps" in literal.stderr
    users = {u["name"]: u["password_hash"] for u in json.loads(out.read_text())["users"]}
    assert check_password(users["fedboost-guest"], "typed-secret")


def test_bare_fedboost_prints_help_and_version_and_help_read_as_plain_text(
        tmp_path: Path) -> None:
    """'fedboost' alone is the help (exit 0), as 'fedboost --help'; '--version' names the
    installed version; the help has no reStructuredText markup; every option says what it is."""
    from importlib.metadata import version

    bare, helped = _run(cwd=tmp_path), _run("--help", cwd=tmp_path)
    assert bare.returncode == 0 and bare.stdout == helped.stdout and bare.stderr == ""
    assert "``" not in bare.stdout and "train" in bare.stdout and "COMMAND --help" in bare.stdout
    shown = _run("--version", cwd=tmp_path)
    assert shown.returncode == 0 and shown.stdout == f"fedboost {version('fedboost')}\n"
    for command, flag in (("predict", "--batch-size"), ("serve-model", "--port"),
                          ("worker", "--log-level")):
        text = _run(command, "--help", cwd=tmp_path).stdout
        described = text.split(f"  {flag} ", 1)[1].split("\n  -", 1)[0]
        assert len(described.split()) > 3, (command, flag, described)  # not just its metavar


def test_ctrl_c_before_any_checkpoint_names_no_resume_command(tmp_path: Path) -> None:
    """SIGINT while the parties open the job or align ids (no checkpoint yet: they make the
    first after binning): exit 130 with a line saying so and how to start again, not a
    'fedboost resume' that would have nothing to continue."""
    import signal

    job = _config(tmp_path, DATA / "breast_hetero_guest.csv", DATA / "breast_hetero_host.csv")
    env = {**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    env.pop("PREFECT_API_URL", None)
    out = tmp_path / "run"
    first = subprocess.Popen([*FEDBOOST, "train", str(job), "--out", str(out)], cwd=tmp_path,
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, start_new_session=True)
    assert first.stdout is not None and first.stderr is not None
    for line in first.stdout:
        if line.startswith("opening: "):  # the flow asks the parties to open the job
            os.killpg(first.pid, signal.SIGINT)
            break
    first.wait(timeout=120)
    err = first.stderr.read()
    assert first.returncode == 130, err
    assert not list(out.glob("*/checkpoints/trees-*.ckpt"))  # indeed nothing to continue
    assert err.splitlines()[-1] == (f"fedboost: interrupted; no party had saved a checkpoint "
                                    f"of the job yet: 'fedboost train {job}' starts it again")
    assert "fedboost resume" not in err


def test_a_multiclass_job_s_last_line_counts_rounds_and_their_trees() -> None:
    """n_trees: 10 with 4 classes grows 40 trees: the line says 10 rounds of them (the
    number the job file gave), as metrics.json's trees_per_round tells it."""
    from fedboost.run_lines import trees_text as _trees_text

    assert _trees_text(40, {"n_trees": 40, "trees_per_round": 4}) == \
        "10 rounds (40 trees: one per class per round)"
    assert _trees_text(30, {"n_trees": 30, "trees_per_round": 1}) == "30 trees"
    assert _trees_text(30, {"n_trees": 30}) == "30 trees"  # a run from before the key
