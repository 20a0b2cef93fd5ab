"""Where the broker password comes from (environment, password file, URL) and that the copy of
a job that is written or handed to Prefect has none."""

from __future__ import annotations

from pathlib import Path

import pika
import pytest

from flows.config import (AMQP_PASSWORD_FILE_ENV, AMQP_URL_ENV, ConfigError, TransportConfig,
                          parse_config, without_broker_password)
from messages.broker_url import redact, with_password, without_password


@pytest.fixture(autouse=True)
def _no_broker_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(AMQP_URL_ENV, raising=False)
    monkeypatch.delenv(AMQP_PASSWORD_FILE_ENV, raising=False)


def _job(tmp_path: Path, transport: dict[str, str]) -> dict[str, object]:
    return {"job": "j", "parties": {"guest": {"role": "active", "label": "y"},
                                    "host": {"role": "passive"}},
            "transport": {"kind": "rabbitmq", **transport},
            "signing": {"key_dir": str(tmp_path)}}


def test_password_file_fills_the_url_and_resolves_against_the_job_file(tmp_path: Path) -> None:
    (tmp_path / "pw").write_text("p@ss/w:rd\nignored\n")
    (tmp_path / "pw").chmod(0o600)
    config = parse_config(_job(tmp_path, {"url": "amqp://alice@broker:5672/fed",
                                          "password_file": "pw"}), base=tmp_path, source="job")
    assert config.transport.password_file == tmp_path / "pw"
    url = config.transport.amqp_url()
    params = pika.URLParameters(url)
    assert (params.credentials.username, params.credentials.password) == ("alice", "p@ss/w:rd")
    assert params.host == "broker" and params.virtual_host == "fed"
    assert without_broker_password(config) is None  # nothing to strip: the file stays a path


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660])
def test_a_password_file_other_users_may_read_is_refused_naming_the_fix(
        tmp_path: Path, mode: int) -> None:
    """As ssh refuses a key file others can read: the password would already be theirs. The
    error names the file, its mode and the chmod; the password never shows."""
    (tmp_path / "pw").write_text("Zx9-k2!pq\n")
    (tmp_path / "pw").chmod(mode)
    config = parse_config(_job(tmp_path, {"url": "amqp://alice@broker:5672/fed",
                                          "password_file": "pw"}), base=tmp_path, source="job")
    with pytest.raises(ConfigError) as refused:
        config.transport.amqp_url()
    message = str(refused.value)
    assert f"{tmp_path / 'pw'}: other users may read it (mode {mode:04o})" in message
    assert f"chmod 600 {tmp_path / 'pw'}" in message and "Zx9-k2!pq" not in message
    (tmp_path / "pw").chmod(0o400)  # the entry point's copy in a container: the owner's alone
    assert pika.URLParameters(config.transport.amqp_url()).credentials.password == "Zx9-k2!pq"


def test_a_worker_given_a_world_readable_password_file_stops_at_start_with_one_line(
        tmp_path: Path) -> None:
    """The real command, as an operator starts it: one clear line, a failing exit, no traceback,
    before it reaches for a broker (the URL's port is closed)."""
    import subprocess
    import sys

    import yaml

    (tmp_path / "broker.pw").write_text("Zx9-k2!pq\n")
    (tmp_path / "broker.pw").chmod(0o644)
    config = tmp_path / "worker.yaml"
    config.write_text(yaml.safe_dump({
        "party": "host", "data": str(tmp_path / "unused.csv"),
        "transport": {"kind": "rabbitmq", "url": "amqp://fedboost-host@127.0.0.1:1/%2F",
                      "password_file": "broker.pw"},
        "signing": {"key_dir": str(tmp_path)}}))
    done = subprocess.run([sys.executable, "-m", "fedboost.cli", "worker", "--party", "host",
                           "--config", str(config)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode != 0
    assert "other users may read it (mode 0644)" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and "Zx9-k2!pq" not in done.stderr + done.stdout


def test_environment_wins_and_a_user_without_password_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert TransportConfig(kind="rabbitmq").amqp_url().startswith("amqp://guest:guest@127.0.0.1")
    transport = TransportConfig(kind="rabbitmq", url="amqp://alice@broker/fed")
    with pytest.raises(ConfigError, match=f"'alice' has no password: set {AMQP_URL_ENV}"):
        transport.amqp_url()
    (tmp_path / "empty").write_text("\n")
    (tmp_path / "empty").chmod(0o600)
    monkeypatch.setenv(AMQP_PASSWORD_FILE_ENV, str(tmp_path / "empty"))
    with pytest.raises(ConfigError, match="the first line is empty"):
        transport.amqp_url()
    monkeypatch.setenv(AMQP_URL_ENV, "amqp://bob:secret@other/fed")
    assert transport.amqp_url() == "amqp://bob:secret@other/fed"


def test_the_written_copy_of_a_job_has_no_password(tmp_path: Path) -> None:
    config = parse_config(_job(tmp_path, {"url": "amqps://alice:s3cret@broker:5671/fed"}),
                          base=tmp_path, source="job")
    stripped = without_broker_password(config)
    assert stripped is not None and "s3cret" not in stripped.model_dump_json()
    assert stripped.transport.url == "amqps://alice@broker:5671/fed"
    assert stripped.model_copy(update={"transport": config.transport}) == config


def test_url_helpers_keep_host_port_and_query() -> None:
    url = "amqp://u:p%40w@[::1]:5672/v?heartbeat=5"
    assert without_password(url) == "amqp://u@[::1]:5672/v?heartbeat=5"
    assert redact(url) == "amqp://u:***@[::1]:5672/v?heartbeat=5"
    assert with_password(without_password(url), "p@w") == url
    assert without_password("amqp://broker/v") == "amqp://broker/v"


def test_the_environment_names_a_password_file_read_whole_line_never_shown(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """FEDBOOST_AMQP_PASSWORD_FILE, as docker-compose.yml mounts it for each worker and the
    runner: its first line is the password (the newline, CRLF too, stripped); a missing file
    is one clear line naming the variable and the path; the password never reaches a message
    or a log line, also when the broker cannot be reached."""
    import logging

    from messages import TransportError
    from messages.broker_url import redact
    from messages.rabbitmq import RabbitTransport

    secret = "Zx9-k2!pq"
    (tmp_path / "amqp").write_text(f"{secret}\r\n")
    (tmp_path / "amqp").chmod(0o600)
    monkeypatch.setenv(AMQP_URL_ENV, "amqp://fedboost-host@127.0.0.1:1/%2F")
    monkeypatch.setenv(AMQP_PASSWORD_FILE_ENV, str(tmp_path / "amqp"))
    url = TransportConfig(kind="rabbitmq").amqp_url()
    assert pika.URLParameters(url).credentials.password == secret
    assert secret not in redact(url)
    with caplog.at_level(logging.DEBUG):
        with pytest.raises(TransportError) as raised:
            RabbitTransport("host", url, party=True, reconnect_seconds=1.0)
    assert "cannot reach the broker at 127.0.0.1:1" in str(raised.value)
    assert secret not in str(raised.value) and secret not in caplog.text
    monkeypatch.setenv(AMQP_PASSWORD_FILE_ENV, str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match=rf"^{AMQP_PASSWORD_FILE_ENV} {tmp_path / 'missing'}: "
                                          rf"cannot read it \(.*No such file"):
        TransportConfig(kind="rabbitmq").amqp_url()
