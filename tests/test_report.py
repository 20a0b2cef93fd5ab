"""A run as a new user sees it: the live progress bar on a terminal, then ``fedboost report``
rendered by headless Chromium (the README's screenshot command).

One small Completely SecureBoost run on the real default_credit data (1024-bit keys, few
trees, a validation share) is trained once, under a pseudo-terminal, and serves every test.
"""

from __future__ import annotations

import fcntl
import html
import os
import pty
import re
import shutil
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest
import yaml

from tests.scenarios import CONFIGS, DATA

N_TREES = 4
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
SCREENSHOT = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
              "--window-size=1280,2000"]


def _job(tmp: Path) -> Path:
    raw = yaml.safe_load((CONFIGS / "default_credit_complete_secure.yaml").read_text())
    raw["job"] = "report-test"
    raw["parties"]["guest"]["data"] = str(DATA / "default_credit_hetero_guest.csv")
    raw["parties"]["host"]["data"] = str(DATA / "default_credit_hetero_host.csv")
    raw["crypto"]["key_bits"] = 1024
    raw["params"]["n_trees"] = N_TREES
    raw["validation"] = {"fraction": 0.2, "seed": 0}
    path = tmp / "job.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _run_in_terminal(args: list[str], cwd: Path) -> tuple[int, str]:
    """Run the command with a pseudo-terminal as stdin, stdout and stderr; return its exit
    status and everything it drew."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))
    env = {**os.environ, "TERM": "xterm-256color", "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    env.pop("PREFECT_API_URL", None)
    proc = subprocess.Popen(args, cwd=cwd, env=env, stdin=slave, stdout=slave, stderr=slave,
                            start_new_session=True)
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    return proc.wait(timeout=60), b"".join(chunks).decode(errors="replace")


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    tmp = tmp_path_factory.mktemp("report")
    code, drawn = _run_in_terminal(
        [sys.executable, "-m", "fedboost.cli", "train", str(_job(tmp)), "--out",
         str(tmp / "run")], cwd=tmp)
    assert code == 0, drawn[-3000:]
    return tmp / "run", drawn


def test_a_terminal_shows_a_live_bar_with_trees_eta_and_metrics(run: tuple[Path, str]) -> None:
    _, drawn = run
    assert "\x1b[" in drawn, drawn[-2000:]  # a live display redraws in place
    frames = [ANSI.sub("", f) for f in re.split(r"[\r\n]", drawn)]
    done = [int(m.group(1)) for f in frames for m in [re.search(rf"trees (\d+)/{N_TREES}", f)]
            if m]
    assert done == sorted(done) and done[-1] == N_TREES and len(set(done)) >= 3, done
    with_eta = [f for f in frames if re.search(r"trees \d+/\d+ .*s/tree .*ETA \d+:\d\d:\d\d", f)]
    assert with_eta and "train_auc=" in with_eta[-1], frames[-20:]
    assert any("PSI" in f for f in frames) and any("binning" in f for f in frames)
    assert f"trained {N_TREES} trees" in drawn
    assert "Starting temporary server" not in drawn  # Prefect's lines wait for --log-level


def _pixels(png: Path) -> tuple[float, float]:
    """Standard deviation of the grey levels and the share of pixels that are not white."""
    from PIL import Image, ImageStat

    grey = Image.open(png).convert("L")
    stat = ImageStat.Stat(grey)
    histogram = grey.histogram()
    return stat.stddev[0], 1 - sum(histogram[250:]) / sum(histogram)


def test_the_report_renders_every_plot_in_headless_chromium(run: tuple[Path, str],
                                                            tmp_path: Path) -> None:
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("chromium is not installed (apt-get install -y chromium)")
    run_dir, _ = run
    made = subprocess.run([sys.executable, "-m", "fedboost.cli", "report", str(run_dir),
                           "--out", str(tmp_path / "report.html")],
                          capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    page = (tmp_path / "report.html").read_text()
    for section in ("summary", "learning-curves", "timing", "feature-importance",
                    "leaf-purity", "trees"):
        assert f'<section id="{section}">' in page, section
    for chart in ("curve-auc", "curve-logloss", "tree-seconds", "step-seconds",
                  "importance-gain", "importance-splits", "leaf-purity", "tree-0"):
        assert f'id="{chart}"' in page, chart
    for series in ("train_auc", "valid_auc"):  # validation after every tree, not just the end
        assert re.search(rf'<polyline class="series" data-name="{series}"', page), series
    assert page.count('class="tree-chart"') == N_TREES
    assert "Completely SecureBoost" in page
    assert not re.search(r"(src|href)=\"https?:", page)  # nothing to fetch: no network

    shot = tmp_path / "report.png"
    subprocess.run([chromium, *SCREENSHOT, f"--screenshot={shot}", f"file://{tmp_path}/"
                    "report.html"], capture_output=True, timeout=120, check=True)
    spread, inked = _pixels(shot)
    assert spread > 20 and inked > 0.03, (spread, inked)


def _importance_names(page: str) -> list[str]:
    chart = page.split('id="importance-splits"', 1)[1].split("</svg>", 1)[0]
    return [html.unescape(n) for n in re.findall(r'class="bar" data-name="([^"]+)"', chart)]


@pytest.mark.parametrize(("party", "other"), [("guest", "host"), ("host", "guest")])
def test_a_party_s_report_names_only_its_own_features(run: tuple[Path, str], tmp_path: Path,
                                                       party: str, other: str) -> None:
    run_dir, _ = run
    from fedboost.report import write_report

    page = write_report(run_dir, party=party, out=tmp_path / "r.html").read_text()
    own = (DATA / f"default_credit_hetero_{party}.csv").read_text().splitlines()[0].split(",")
    names = _importance_names(page)
    assert names
    for name in names:
        assert name in own or re.fullmatch(rf"{other}:feature#\d+", name), name
    assert any(name in own for name in names) and any(":" in name for name in names)
    leaves = re.findall(r'<g class="tree-node leaf">.*?</g>', page)
    values = [v for leaf in leaves for v in re.findall(r">([+-]\d\.\d+)<", leaf)]
    assert bool(values) == (party == "guest")  # leaf values are the active party's alone
