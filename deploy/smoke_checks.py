"""The checks deploy/compose-smoke.sh makes against the running federation's Prefect server
(http://127.0.0.1:FEDBOOST_PREFECT_PORT, default 4200; basic auth from FEDBOOST_PREFECT_AUTH_STRING), each a subcommand:

  wait-run ID SECONDS     wait for a flow run to end; exit 0 if it completed, else print its
                          state and message and exit 1
  retry ID                schedule a failed flow run again, as the UI's Retry does
  params JOB_FILE KEY=VALUE...  a deployment run's --params: the job file's content with
                          dotted keys set (transport.step_timeout=60)
  ui ID PNG               log in to the Prefect UI in headless Chromium (the login form, as a
                          user does), open the flow run's page and its Artifacts tab, check
                          that they render the run, and save a screenshot

Run with the Python of the fedboost command (it has httpx, websockets and PyYAML)."""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

UI = f"http://127.0.0.1:{os.environ.get('FEDBOOST_PREFECT_PORT', '4200')}"
ENDED = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}


def _api() -> httpx.Client:
    user, _, password = os.environ["FEDBOOST_PREFECT_AUTH_STRING"].partition(":")
    return httpx.Client(base_url=f"{UI}/api", auth=(user, password), timeout=30)


def wait_run(run_id: str, seconds: float) -> int:
    deadline = time.monotonic() + seconds
    with _api() as api:
        while True:
            run = api.get(f"/flow_runs/{run_id}").raise_for_status().json()
            state = run["state"] or {}
            if state.get("type") in ENDED:
                break
            if time.monotonic() > deadline:
                print(f"flow run {run['name']} still {state.get('name')} after {seconds:.0f} s")
                return 1
            time.sleep(3)
    print(f"flow run {run['name']}: {state['name']}"
          + ("" if state["type"] == "COMPLETED" else f": {state.get('message')}"))
    return 0 if state["type"] == "COMPLETED" else 1


def retry(run_id: str) -> int:
    with _api() as api:
        api.post(f"/flow_runs/{run_id}/set_state",
                 json={"state": {"type": "SCHEDULED", "name": "AwaitingRetry",
                                 "message": "Retry from compose-smoke.sh"},
                       "force": True}).raise_for_status()
    return 0


def params(job_file: Path, settings: list[str]) -> int:
    config = yaml.safe_load(job_file.read_text())
    for setting in settings:
        key, _, value = setting.partition("=")
        *path, last = key.split(".")
        node = config
        for part in path:
            node = node[part]
        node[last] = yaml.safe_load(value)
    print(json.dumps({"config": config}))
    return 0


class _Page:
    """One Chromium tab driven over the DevTools protocol."""

    def __init__(self, url: str) -> None:
        from websockets.sync.client import connect

        self.socket = connect(url, max_size=None, open_timeout=30)
        self.next_id = 0

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        self.socket.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:  # events in between are of no interest
            message = json.loads(self.socket.recv(timeout=60))
            if message.get("id") == self.next_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return dict(message.get("result", {}))

    def js(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True,
                           awaitPromise=True)
        return result.get("result", {}).get("value")

    def text(self) -> str:
        return str(self.js("document.body ? document.body.innerText : ''") or "")

    def wait_for(self, check: Any, seconds: float, what: str) -> str:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            text = self.text()
            if check(text):
                return text
            time.sleep(1)
        raise SystemExit(f"the Prefect UI: {what} not shown after {seconds:.0f} s; the page "
                         f"shows: {self.text()[:400]!r}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ui(run_id: str, screenshot: Path) -> int:
    with _api() as api:
        run = api.get(f"/flow_runs/{run_id}").raise_for_status().json()
        artifacts = api.post("/artifacts/filter", json={
            "artifacts": {"flow_run_id": {"any_": [run_id]}}}).raise_for_status().json()
    descriptions = [a["description"] for a in artifacts if a.get("description")]
    assert descriptions, f"flow run {run['name']} has no artifacts"
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("chromium is not installed (apt-get install -y chromium)")
    port = _free_port()
    with tempfile.TemporaryDirectory() as profile:
        browser = subprocess.Popen(
            [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             "--window-size=1400,1400", f"--remote-debugging-port={port}",
             f"--user-data-dir={profile}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    targets = httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=5).json()
                    break
                except httpx.HTTPError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.5)
            page = _Page(next(t for t in targets if t["type"] == "page")["webSocketDebuggerUrl"])
            _check_run_page(page, run, descriptions, screenshot)
        finally:
            browser.terminate()
            browser.wait(timeout=30)
    return 0


def _check_run_page(page: _Page, run: dict[str, Any], descriptions: list[str],
                    screenshot: Path) -> None:
    # the UI a user lands on (Prefect 3.8: v2 under /v2, the old one under /)
    settings = httpx.get(f"{UI}/ui-settings", timeout=30).raise_for_status().json()
    base = settings[f"{settings['default_ui']}_base_url"].rstrip("/")
    login = "document.querySelector('input[type=password]')"
    page.call("Page.enable")
    page.call("Page.navigate", url=f"{UI}/")
    page.wait_for(lambda text: bool(page.js(f"!!{login}")), 90, "the login form")
    page.js(f"{login}.focus()")  # one field that takes the whole user:password
    page.call("Input.insertText", text=os.environ["FEDBOOST_PREFECT_AUTH_STRING"])
    page.js("document.querySelector('form button[type=submit]').click()")
    page.wait_for(lambda text: "Dashboard" in text and not page.js(f"!!{login}"), 90,
                  "the dashboard after the login")
    url = f"{UI}{base}/runs/flow-run/{run['id']}"
    page.call("Page.navigate", url=url)
    text = page.wait_for(lambda text: run["name"] in text and "Completed" in text, 120,
                         f"flow run {run['name']} (Completed) at {url}")
    assert "Not Found" not in text, text[:400]
    page.call("Page.navigate", url=f"{url}?tab=Artifacts")
    # each artifact's description without its job ('default-credit: metrics per tree; ...')
    phrases = [d.split(": ", 1)[-1].split(";")[0] for d in descriptions]
    page.wait_for(lambda text: all(p in text for p in phrases), 120,
                  f"the run's artifacts ({', '.join(phrases)})")
    time.sleep(2)  # the charts' images
    shot = page.call("Page.captureScreenshot", format="png")
    screenshot.write_bytes(base64.b64decode(shot["data"]))
    print(f"=> the Prefect UI ({settings['default_ui']}) shows flow run {run['name']} "
          f"(Completed) and its {len(descriptions)} artifacts; screenshot {screenshot}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("wait-run").add_argument("id")
    sub.choices["wait-run"].add_argument("seconds", type=float)
    sub.add_parser("retry").add_argument("id")
    sub.add_parser("params").add_argument("job_file", type=Path)
    sub.choices["params"].add_argument("settings", nargs="*")
    sub.add_parser("ui").add_argument("id")
    sub.choices["ui"].add_argument("screenshot", type=Path)
    args = parser.parse_args(argv)
    if args.command == "wait-run":
        return wait_run(args.id, args.seconds)
    if args.command == "retry":
        return retry(args.id)
    if args.command == "params":
        return params(args.job_file, args.settings)
    return ui(args.id, args.screenshot)


if __name__ == "__main__":
    sys.exit(main())
