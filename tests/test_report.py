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
              "--window-size=1280,6000"]  # the README's: taller than the page, so all of it


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
    # the last frame's s/tree is the run's figure: the median of its trees' seconds
    import json
    import statistics

    seconds = [t["seconds"] for t in json.loads((run[0] / "metrics.json").read_text())["trees"]]
    last = [f for f in frames if re.search(rf"trees {N_TREES}/{N_TREES} .*s/tree", f)][-1]
    shown = float(re.search(r"([\d.]+) s/tree", last).group(1))  # type: ignore[union-attr]
    assert abs(shown - statistics.median(seconds)) < 0.006, (shown, seconds)
    assert "Starting temporary server" not in drawn  # Prefect's lines wait for --log-level


def _pixels(png: Path, height: int) -> tuple[float, float]:
    """Standard deviation of the grey levels and the share of pixels that are not white, in
    the picture's first ``height`` rows (the page; the window below it is blank)."""
    from PIL import Image, ImageStat

    grey = Image.open(png).convert("L")
    grey = grey.crop((0, 0, grey.width, height))
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
    # the whole page is in the picture, trees last: white rows below its end, the trees'
    # drawings (strokes in colour) in the last part that has any ink
    rows = _inked_rows(shot)
    spread, inked = _pixels(shot, rows[-1] + 1)
    assert spread > 20 and inked > 0.03, (spread, inked)
    assert rows[-1] < _height(shot) - 50, (rows[-1], _height(shot))
    assert _coloured_rows(shot, rows[-1] - 300, rows[-1]), "no tree drawn at the page's end"
    for chart in ("tree-seconds", "leaf-purity", "curve-auc"):  # trees are numbered from 0
        svg = page.split(f'id="{chart}"', 1)[1].split("</svg>", 1)[0]
        ticks = [int(t) for t in re.findall(r'text-anchor="middle">(\d+)</text>', svg)]
        assert ticks and ticks[0] == 0 and ticks[-1] == N_TREES - 1, (chart, ticks)


def _height(png: Path) -> int:
    from PIL import Image

    return Image.open(png).height


def _inked_rows(png: Path) -> list[int]:
    """The rows of the picture that are not all white."""
    from PIL import Image

    grey = Image.open(png).convert("L")
    width = grey.width
    data = grey.tobytes()
    return [y for y in range(grey.height) if min(data[y * width:(y + 1) * width]) < 250]


def _coloured_rows(png: Path, first: int, last: int) -> bool:
    """Whether rows first..last hold the trees' blue or orange edges."""
    from PIL import Image

    rgb = Image.open(png).convert("RGB").crop((0, max(0, first), 1280, last)).tobytes()
    return any(abs(rgb[k] - rgb[k + 2]) > 80 for k in range(0, len(rgb), 3))


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
    # the active party sees which of the other's columns split; the data provider only its own
    assert any(name in own for name in names) and (any(":" in name for name in names)
                                                   == (party == "guest"))
    leaves = re.findall(r'<g class="tree-node leaf">.*?</g>', page)
    values = [v for leaf in leaves for v in re.findall(r">([+-]\d\.\d+)<", leaf)]
    assert bool(values) == (party == "guest")  # leaf values are the active party's alone


def test_the_data_provider_s_view_holds_only_what_its_files_and_messages_hold(
        run: tuple[Path, str], tmp_path: Path) -> None:
    """Every number and name in the host's report comes from the host's own lookup table, the
    job spec and the row counts its alignment message told it; nothing derived from labels
    (metrics, leaf purity, gains, leaf values) and, under Completely SecureBoost, nothing of
    tree 0, which the active party grew alone."""
    import json

    from fedboost.report import write_report

    run_dir, _ = run
    page = write_report(run_dir, party="host", out=tmp_path / "host.html").read_text()
    lookup = json.loads((run_dir / "host" / "lookup.json").read_text())
    metrics = json.loads((run_dir / "metrics.json").read_text())
    for section in ("learning-curves", "timing", "leaf-purity"):
        assert f'<section id="{section}">' not in page, section
    body = re.sub(r'<section id="view">.*?</section>', "", page.split("</style>", 1)[1])
    for label_derived in ("gain", "train_auc", "valid_auc", "logloss", "purity", "leaf"):
        assert label_derived not in body, label_derived  # the note above says they're left out
    header = {p: set((DATA / f"default_credit_hetero_{p}.csv").read_text().splitlines()[0]
                     .split(",")) for p in ("guest", "host")}
    cells = {html.unescape(c) for c in re.findall(r"<td>([^<]*)</td>", page)}
    assert not cells & (header["guest"] - header["host"])  # no column of the guest's alone
    assert "guest:" not in page  # nor any as guest:feature#k
    # the splits table is the lookup table, record for record
    shown = re.findall(r"<tr><td>(\d+)</td><td>(\d+)</td><td>(\d+)</td><td>([^<]+)</td>"
                       r"<td>([^<]+)</td></tr>", page)
    held = {(str(r["tree"]), str(r["depth"]), k, lookup["features"][r["feature"]],
             f"{r['threshold']:.4g}") for k, r in lookup["records"].items()}
    assert shown and set(shown) == held
    assert "0" not in {tree for tree, *_ in shown}  # Completely SecureBoost: tree 0 is guest's
    # numbers: the row counts (what its ALIGNED_ROWS message held) and the job's parameters
    summary = page.split('<section id="summary">', 1)[1].split("</section>", 1)[0]
    numbers = {n for cell in re.findall(r"<td>([^<]*)</td>", summary)
               for n in re.findall(r"\d+(?:\.\d+)?", cell)}
    allowed = {str(metrics[k]) for k in ("n_aligned", "n_train", "n_valid", "n_trees",
                                         "resumed_after", "key_bits")} | set(re.findall(
        r"\d+(?:\.\d+)?", json.dumps(json.loads((run_dir / "job.json").read_text()))))
    assert numbers <= allowed, numbers - allowed
