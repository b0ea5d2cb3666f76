"""Hosts outside Python and outside this machine: a Node.js client, and the bearer token.

The Node.js client needs ``node``: in CI (``CI=true``) a missing one fails the test,
elsewhere it skips with the reason, as the Chromium and PostgreSQL tests do."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.cli import lamina
from tests.lamina.server import ROOT, running

CLIENT = ROOT / "examples" / "js" / "client.mjs"
TOKEN = "s3cret-token-for-the-tests-0123456789"


def _node() -> str:
    """The ``node`` binary; missing, a failure in CI and a skip that says why elsewhere."""
    node = shutil.which("node")
    if node is None:
        if os.environ.get("CI") == "true":
            pytest.fail("node is missing in CI: .ci/run installs Debian's nodejs package")
        pytest.skip("node is not installed (apt-get install nodejs); CI runs this test")
    return node


def test_a_plain_node_client_runs_three_turns_with_client_notes(tmp_path: Path) -> None:
    node = _node()
    with running(tmp_path / "s.sqlite") as url:
        done = subprocess.run(
            [node, str(CLIENT), url], capture_output=True, text=True, timeout=120, check=False
        )
        assert done.returncode == 0, done.stderr
        result = json.loads(done.stdout)
        assert result["turns"] == 3
        saved = httpx.get(f"{url}/v1/conversations/{result['conversation']}", timeout=60).json()
        assert saved["head"] == {"turn": 3, "hash": result["head"]}


def test_binding_beyond_loopback_without_a_token_refuses_to_start(tmp_path: Path) -> None:
    result = lamina("serve", "--host", "0.0.0.0", "--store", str(tmp_path / "s.sqlite"))
    assert result.returncode == 2
    assert result.stderr.startswith("lamina: error: --host: binding 0.0.0.0")
    assert "--token-file" in result.stderr
    assert not (tmp_path / "s.sqlite").exists()


@pytest.mark.parametrize("text", ["", "short"])
def test_an_empty_or_short_token_file_is_refused(tmp_path: Path, text: str) -> None:
    token = tmp_path / "token"
    token.write_text(text, encoding="utf-8")
    result = lamina("serve", "--token-file", str(token), "--store", str(tmp_path / "s.sqlite"))
    assert result.returncode == 2
    assert "at least 16 characters" in result.stderr


def test_with_a_token_every_request_needs_it(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n", encoding="utf-8")
    with running(tmp_path / "s.sqlite", "--token-file", str(token), token=TOKEN) as url:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
            for method, path in (("GET", "/v1/conversations"), ("GET", "/openapi.json")):
                response = httpx.request(method, url + path, headers=headers, timeout=60)
                assert response.status_code == 401
                assert response.json()["field"] == "authorization"
                assert response.headers["www-authenticate"] == "Bearer"
            created = httpx.post(f"{url}/v1/conversations", json={}, headers=headers, timeout=60)
            assert created.status_code == 401
        good = {"Authorization": f"Bearer {TOKEN}"}
        created = httpx.post(f"{url}/v1/conversations", json={}, headers=good, timeout=60)
        assert created.status_code == 201
        listed = httpx.get(f"{url}/v1/conversations", headers=good, timeout=60).json()
        assert [c["id"] for c in listed["conversations"]] == [created.json()["id"]]
        node = shutil.which("node")
        if node is not None:
            done = subprocess.run(
                [node, str(CLIENT), url, TOKEN], capture_output=True, text=True, timeout=120
            )
            assert done.returncode == 0, done.stderr
