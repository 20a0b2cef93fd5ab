"""``messages.broker_links``: each organisation's broker definitions from a federation
description (the per-organisation topology; tests/test_netns_brokers.py runs them on real
brokers)."""

from __future__ import annotations

import base64
import hashlib
import json
import re
from pathlib import Path

import pytest

from messages.broker_links import DescriptionError, Federation, main, password_hash

DESCRIPTION = {"lender": "bank", "organisations": {
    "bank": {"address": "10.0.0.11", "parties": ["guest"]},
    "telco": {"address": "10.0.0.12", "parties": ["host"]},
    "shop": {"address": "10.0.0.13", "parties": ["host_1", "host_2"]}}}


def test_adding_parties_adds_links_not_rights() -> None:
    federation = Federation.from_description(DESCRIPTION)
    bank, shop = federation.definitions("bank"), federation.definitions("shop")
    # a shovel per party elsewhere (and, away from the lender, one for the flow replies)
    assert sorted(p["name"] for p in bank["parameters"]) == [
        "fedboost-to-host", "fedboost-to-host_1", "fedboost-to-host_2"]
    assert sorted(p["name"] for p in shop["parameters"]) == [
        "fedboost-to-flows", "fedboost-to-guest", "fedboost-to-host"]
    # a link user per other organisation, writing its own exchange only, reading nothing
    assert {u["name"] for u in shop["users"]} == {"from-bank", "from-telco"}
    for permission in shop["permissions"]:
        sender = permission["user"].removeprefix("from-")
        assert permission["write"] == f"^fedboost\\.from\\.{sender}$"
        assert permission["configure"] == permission["read"] == "^$"
    keys = {t["user"]: re.compile(t["write"]) for t in shop["topic_permissions"]}
    assert keys["from-bank"].match("fedboost.host_1") and keys["from-bank"].match("fedboost.host_2")
    for refused in ("fedboost.guest", "fedboost.host", "fedboost.host_1.work",
                    "fedboost.flow.job.1", "fedboost.host_1x"):
        assert not keys["from-bank"].match(refused), refused
    lender = {t["user"]: re.compile(t["write"]) for t in bank["topic_permissions"]}
    assert lender["from-shop"].match("fedboost.flow.job.1234")
    assert not lender["from-shop"].match("fedboost.host_1")
    # each shovel logs in to the receiver as that receiver's link user for this organisation,
    # with the password the receiver's definitions hold the hash of
    for parameter in shop["parameters"]:
        uri = parameter["value"]["dest-uri"]
        assert uri.startswith("amqps://from-shop:")
        assert "verify=verify_peer" in uri and "server_name_indication=broker." in uri
    password = federation.link_password("bank", "shop")
    stored = next(u for u in bank["users"] if u["name"] == "from-shop")["password_hash"]
    raw = base64.b64decode(stored)
    assert raw[4:] == hashlib.sha256(raw[:4] + password.encode()).digest()
    assert f"from-shop:{password}@10.0.0.11" in json.dumps(shop)
    assert password not in json.dumps(bank)


def test_password_hash_is_rabbitmqs_salted_sha256() -> None:
    raw = base64.b64decode(password_hash("secret"))
    assert len(raw) == 36 and raw[4:] == hashlib.sha256(raw[:4] + b"secret").digest()


@pytest.mark.parametrize(("change", "message"), [
    ({"lender": "nobody"}, "the lender 'nobody' is not one of the organisations"),
    ({"organisations": {"bank": DESCRIPTION["organisations"]["bank"]}}, "at least two"),
    ({"organisations": {**DESCRIPTION["organisations"],
                        "twice": {"address": "10.0.0.14", "parties": ["guest"]}}},
     "party 'guest' is in 'bank' and 'twice'"),
    ({"organisations": {**DESCRIPTION["organisations"],
                        "Bad!": {"address": "x", "parties": ["p"]}}},
     "bad organisation name 'Bad!'"),
])
def test_a_bad_description_is_refused_in_one_line(change: dict, message: str) -> None:
    with pytest.raises(DescriptionError, match=re.escape(message)):
        Federation.from_description({**DESCRIPTION, **change})


def test_the_command_writes_each_brokers_files(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "federation.json").write_text(json.dumps(DESCRIPTION))
    assert main([str(tmp_path / "federation.json"), str(tmp_path / "out")]) == 0
    for org in DESCRIPTION["organisations"]:
        definitions = tmp_path / "out" / org / "definitions.json"
        assert definitions.stat().st_mode & 0o777 == 0o600  # it holds link passwords
        assert "listeners.ssl.1" in (tmp_path / "out" / org / "tls.conf").read_text()
    (tmp_path / "bad.json").write_text(json.dumps({**DESCRIPTION, "lender": "x"}))
    assert main([str(tmp_path / "bad.json"), str(tmp_path / "out")]) == 1
    assert "lender 'x'" in capsys.readouterr().err
