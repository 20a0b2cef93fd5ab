"""TLS to the broker (issue 12, item 8), against a real RabbitMQ node of the test's own.

The node listens only on a TLS port on loopback (no plain listener at all), with the settings of
``deploy/rabbitmq.conf``: ``verify_peer`` and ``fail_if_no_peer_cert``. Its CA and certificates
come from ``deploy/make-certs.sh`` (openssl), so the documented recipe is the one tested. A job
trains over ``amqps://`` with worker processes started through the CLI, each presenting its own
client certificate; clients with no certificate, one from another CA, or expecting another
broker name are refused.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from fedboost.embedded import train_embedded
from fedboost.local_workers import start_worker
from flows.config import ConfigError, load_config
from flows.worker_config import load_worker_config
from flows.secureboost import vertical_secureboost
from messages import TransportError
from messages.rabbitmq import RabbitTransport
from messages.signing import write_key_pair
from messages.tls import TlsOptions
from tests.scenarios import DATA, REPO, unavailable, wait_until

SERVER_NAME = "localhost"
"""The only name in the broker's certificate (``make-certs.sh -s localhost``)."""


@dataclass
class TlsNode:
    name: str
    port: int
    certs: Path
    """ca.pem, server.pem/.key and guest/host/flow.pem/.key, from the test CA."""
    other: Path
    """Another CA and a client certificate ``rogue`` it signed."""
    ctl: list[str]

    def url(self, host: str = SERVER_NAME) -> str:
        return f"amqps://guest:guest@{host}:{self.port}/%2F"

    def tls(self, identity: str | None, ca: Path | None = None, **extra: str) -> TlsOptions:
        certs = self.other if identity == "rogue" else self.certs
        return TlsOptions(ca_file=str(ca or self.certs / "ca.pem"),
                          cert_file=identity and str(certs / f"{identity}.pem"),
                          key_file=identity and str(certs / f"{identity}.key"), **extra)

    def connections(self) -> list[dict[str, object]]:
        done = subprocess.run([*self.ctl, "-n", self.name, "list_connections", "user", "ssl",
                               "peer_cert_subject", "--formatter", "json", "-q"],
                              capture_output=True, text=True, timeout=60, check=True)
        return list(json.loads(done.stdout))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _make_certs(out: Path, *names: str) -> None:
    subprocess.run(["sh", str(REPO / "deploy" / "make-certs.sh"), "-o", str(out), "-s",
                    SERVER_NAME, *names], check=True, capture_output=True, timeout=60)


def _node_tools() -> tuple[list[str], list[str], Path]:
    """How to start and control a node, and where its folder goes. As root, Debian's wrappers
    run the node as the ``rabbitmq`` user, which must own its folder (and reach it: /tmp, not
    pytest's 0700 folder); as anyone else, the scripts run as that user."""
    server, ctl = shutil.which("rabbitmq-server"), shutil.which("rabbitmqctl")
    if server is None or ctl is None or shutil.which("openssl") is None:
        unavailable("rabbitmq-server and openssl are needed for the TLS broker test "
                    "(apt-get install rabbitmq-server openssl)")
    folder = Path(tempfile.mkdtemp(prefix="fedboost-tls-node-"))
    if os.geteuid() == 0:
        return [str(server)], [str(ctl)], folder
    scripts = Path("/usr/lib/rabbitmq/bin")
    if (scripts / "rabbitmq-server").is_file():  # Debian's wrappers refuse other users
        return [str(scripts / "rabbitmq-server")], [str(scripts / "rabbitmqctl")], folder
    return [str(server)], [str(ctl)], folder


def _node_config(folder: Path, port: int) -> str:
    """``deploy/rabbitmq.conf``'s TLS settings, with this node's port and files."""
    shipped = (REPO / "deploy" / "rabbitmq.conf").read_text()
    settings = [line for line in shipped.splitlines()
                if line.startswith(("ssl_options.verify", "ssl_options.fail_if_no_peer_cert",
                                    "listeners.tcp"))]
    assert len(settings) == 3, "deploy/rabbitmq.conf lost its TLS settings"
    return "\n".join([*settings, f"listeners.ssl.default = 127.0.0.1:{port}",
                      f"ssl_options.cacertfile = {folder}/ca.pem",
                      f"ssl_options.certfile = {folder}/server.pem",
                      f"ssl_options.keyfile = {folder}/server.key", ""])


@pytest.fixture(scope="module")
def tls_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsNode]:
    """A throwaway RabbitMQ node with only a TLS listener, stopped at the end."""
    start, ctl, folder = _node_tools()
    root = tmp_path_factory.mktemp("tls")
    certs, other = root / "certs", root / "other"
    _make_certs(certs, "guest", "host", "flow")
    _make_certs(other, "rogue")
    port, name = _free_port(), f"fedboost-tls-{uuid.uuid4().hex[:6]}@localhost"
    for file in ("ca.pem", "server.pem", "server.key"):
        shutil.copy(certs / file, folder / file)
    (folder / "node.conf").write_text(_node_config(folder, port))
    (folder / "plugins").write_text("[].\n")
    if os.geteuid() == 0:
        shutil.chown(folder, "rabbitmq", "rabbitmq")
        for path in folder.iterdir():
            shutil.chown(path, "rabbitmq", "rabbitmq")
    env = {**os.environ, "RABBITMQ_NODENAME": name, "RABBITMQ_CONFIG_FILE": str(folder / "node"),
           "RABBITMQ_MNESIA_BASE": str(folder / "mnesia"), "RABBITMQ_LOG_BASE": str(folder / "log"),
           "RABBITMQ_DIST_PORT": str(_free_port()),
           "RABBITMQ_ENABLED_PLUGINS_FILE": str(folder / "plugins"),
           "RABBITMQ_PID_FILE": str(folder / "pid"),
           "RABBITMQ_FEATURE_FLAGS_FILE": str(folder / "feature_flags"), "HOME": str(folder)}
    log = (root / "node.log").open("w")
    proc = subprocess.Popen(start, env=env, stdout=log, stderr=subprocess.STDOUT)
    node = TlsNode(name, port, certs, other, ctl)
    try:
        def up() -> bool:
            assert proc.poll() is None, f"the node died: {(root / 'node.log').read_text()[-2000:]}"
            RabbitTransport("probe", node.url(), party=False, reconnect_seconds=0,
                            tls=node.tls("flow")).close()
            return True
        wait_until(lambda: _quietly(up), 120, f"RabbitMQ TLS node {name}")
        yield node
    finally:
        subprocess.run([*ctl, "-n", name, "stop"], env={**os.environ, "HOME": str(folder)},
                       capture_output=True, timeout=120)
        try:
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
            shutil.rmtree(folder, ignore_errors=True)


def _quietly(check) -> bool:  # type: ignore[no-untyped-def]
    try:
        return bool(check())
    except TransportError:
        return False


# ---- who may connect ------------------------------------------------------------------------

def _refusal(node: TlsNode, tls: TlsOptions | None, url: str | None = None) -> str:
    with pytest.raises(TransportError) as refused:
        RabbitTransport("flow.tls-probe", url or node.url(), party=False, tls=tls,
                        reconnect_seconds=15)
    return str(refused.value)


def test_a_client_without_a_certificate_of_the_federation_is_refused(tls_node: TlsNode) -> None:
    # the same client with its certificate gets in: the refusals below are about the certificate
    RabbitTransport("flow.tls-probe", tls_node.url(), party=False, tls=tls_node.tls("flow")).close()
    # TLS 1.3 sends the refusal after the handshake; a first attempt may see only the EOF
    refused = "client certificate|cannot reach the broker"
    assert re.search(refused, _refusal(tls_node, tls_node.tls(None)))
    assert re.search(refused, _refusal(tls_node, tls_node.tls("rogue")))


def test_a_client_refuses_a_broker_it_cannot_verify(tls_node: TlsNode) -> None:
    wrong_name = _refusal(tls_node, tls_node.tls("flow", server_hostname="broker.example"))
    assert "Hostname mismatch" in wrong_name and "guest:guest" not in wrong_name
    other_ca = _refusal(tls_node, tls_node.tls("flow", ca=tls_node.other / "ca.pem"))
    assert "certificate failed verification" in other_ca
    # amqps:// without tls: the system's CA store, which does not know the test CA
    assert "certificate failed verification" in _refusal(tls_node, None)
    # TLS settings are never dropped for a plain URL
    plain = _refusal(tls_node, tls_node.tls("flow"), tls_node.url().replace("amqps", "amqp"))
    assert "transport.tls needs an amqps://" in plain


def test_a_worker_refuses_a_broker_with_another_name(tls_node: TlsNode, tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    write_key_pair(keys, "guest")
    worker_file = _worker_file(tmp_path, tls_node, "guest", keys, server_hostname="broker.example")
    proc = _start_worker("guest", worker_file, tmp_path, tmp_path / "guest.log")
    try:
        code = proc.wait(timeout=120)
    finally:
        _stop(proc)
    log = (tmp_path / "guest.log").read_text()
    assert code == 1, log
    assert "Hostname mismatch, certificate is not valid for 'broker.example'" in log


def _start_worker(party: str, config: Path, cwd: Path, log: Path) -> subprocess.Popen[bytes]:
    """``fedboost worker`` in a session of its own, so that ``_stop`` reaches its processes."""
    return start_worker(party, config, log=log, cwd=cwd, new_session=True)


def _stop(proc: subprocess.Popen[bytes]) -> int:
    """SIGTERM, as a service manager would; SIGKILL for the whole session if that fails."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=60)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


# ---- training over amqps --------------------------------------------------------------------

def _worker_file(folder: Path, node: TlsNode, party: str, keys: Path, **tls: str) -> Path:
    """A party's worker file whose certificate paths are relative to its own folder."""
    certs = folder / "certs"
    certs.mkdir(exist_ok=True)
    for file in ("ca.pem", f"{party}.pem", f"{party}.key"):
        shutil.copy(node.certs / file, certs / file)
    raw = {"party": party, "role": "active" if party == "guest" else "passive",
           "data": str(DATA / f"breast_hetero_{party}.csv"), "id": "id",
           "models": "models", "processes": 1 if party == "guest" else 2,
           "policy": {"min_key_bits": 1024},
           "transport": {"kind": "rabbitmq", "url": node.url(),
                         "tls": {"ca_file": "certs/ca.pem", "cert_file": f"certs/{party}.pem",
                                 "key_file": f"certs/{party}.key", **tls}},
           "signing": {"key_dir": str(keys)}}
    if party == "guest":
        raw["label"] = "y"
    path = folder / f"{party}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _job_file(folder: Path, node: TlsNode, keys: Path) -> Path:
    raw = yaml.safe_load((REPO / "configs" / "breast.yaml").read_text())
    for party in raw["parties"].values():
        party["data"] = str((REPO / "configs" / party["data"]).resolve())
    raw.update(job=f"breast-tls-{uuid.uuid4().hex[:6]}", signing={"key_dir": str(keys)},
               transport={"kind": "rabbitmq", "url": node.url(), "tls": {
                   "ca_file": str(node.certs / "ca.pem"),
                   "cert_file": str(node.certs / "flow.pem"),
                   "key_file": str(node.certs / "flow.key")}})
    raw["params"]["n_trees"] = 2
    raw["crypto"]["key_bits"] = 1024
    path = folder / "job.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_harness")
def test_training_over_amqps_equals_the_embedded_run(tls_node: TlsNode, tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    for name in ("guest", "host", "flow"):
        write_key_pair(keys, name)
    config = load_config(_job_file(tmp_path, tls_node, keys))
    parties = {}
    for party in ("guest", "host"):
        folder = tmp_path / party
        folder.mkdir()
        parties[party] = _worker_file(folder, tls_node, party, keys)
        # relative certificate paths resolve against the worker file's folder
        tls = load_worker_config(parties[party], party).transport.tls
        assert tls is not None and tls.cert_file == folder / "certs" / f"{party}.pem"
    procs = [_start_worker(party, path, tmp_path, tmp_path / f"{party}.log")
             for party, path in parties.items()]
    try:
        result = vertical_secureboost(config)
        # every connection, each worker process's own and the flow's, is TLS with its own
        # client certificate (the node has no other listener)
        seen = tls_node.connections()
        assert seen and all(c["ssl"] is True for c in seen), seen
        assert {"CN=guest", "CN=host"} <= {c["peer_cert_subject"] for c in seen}, seen
    finally:
        codes = [_stop(proc) for proc in procs]
    assert codes == [0, 0], codes
    memory = config.model_copy(update={"transport": config.transport.model_copy(
        update={"kind": "memory", "tls": None})})
    expected = train_embedded(memory, tmp_path / "embedded")
    assert result["train_auc"] == expected["train_auc"]
    got = tmp_path / "guest" / "models" / config.job / "guest" / "model.json"
    assert got.read_bytes() == (tmp_path / "embedded" / "guest" / "model.json").read_bytes()
    host_log = (tmp_path / "host.log").read_text()
    assert "step=HISTOGRAM_SHARD" in host_log, "the host's helper process took no work over TLS"


# ---- configuration --------------------------------------------------------------------------

def test_tls_with_a_plain_url_is_a_config_error_naming_the_key(tmp_path: Path) -> None:
    from flows.config import parse_config

    raw = yaml.safe_load((REPO / "deploy" / "job.yaml").read_text())
    raw["transport"] = {"kind": "rabbitmq", "url": "amqp://broker:5672/%2F",
                        "tls": {"ca_file": "ca.pem"}}
    with pytest.raises(ConfigError, match=r"key 'transport\.tls': needs an amqps:// url"):
        parse_config(raw, base=tmp_path, source="job.yaml")
    raw["transport"]["url"] = "amqps://broker:5671/%2F"
    raw["transport"]["tls"] = {"ca_file": "ca.pem", "cert_file": "me.pem"}
    with pytest.raises(ConfigError, match=r"cert_file and key_file: give both"):
        parse_config(raw, base=tmp_path, source="job.yaml")
    raw["transport"]["tls"] = {"ca_file": "tls/ca.pem"}
    tls = parse_config(raw, base=tmp_path, source="job.yaml").transport.tls
    assert tls is not None and tls.ca_file == tmp_path / "tls" / "ca.pem"
