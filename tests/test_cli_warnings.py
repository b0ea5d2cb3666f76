"""Warnings reach the user: in the JSON trace, in ``inspect``, and on stderr."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.cli import lamina

VTT = """WEBVTT

00:00:01.000 --> 00:00:02.000
First cue.

00:00:02.500 -> 00:00:03.000
This cue has a broken timing line.

00:00:04.000 --> 00:00:05.000
Third cue.
"""

EXPECTED = [
    ("frontmatter-malformed", "note:bad.md", "malformed YAML frontmatter at line 2; read as body"),
    (
        "note-not-utf8",
        "note:latin.md",
        "not valid UTF-8 (first bad byte at offset 3); undecodable bytes were replaced with U+FFFD",
    ),
    (
        "subtitle-bad-timing",
        "youtube:dQw4w9WgXcQ",
        "1 cue was skipped: unreadable timing line (line 6 of the file)",
    ),
    ("page-no-text", "url:{site}/empty", "no readable text found on the page"),
]


class _Empty(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.end_headers()
        self.wfile.write(b"<html><body><script>1</script></body></html>")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def site() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Empty)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def script(tmp_path: Path, site: str) -> Path:
    vault = tmp_path / "vault"
    vault.mkdir()
    (vault / "bad.md").write_text("---\ntitle: [unclosed\n---\nbody\n", encoding="utf-8")
    (vault / "latin.md").write_bytes(b"caf\xe9 ok\n")
    (vault / "talk.vtt").write_text(VTT, encoding="utf-8")
    path = tmp_path / "chat.json"
    attach = [
        {"note": "bad.md"},
        {"note": "latin.md"},
        {"youtube": "https://youtu.be/dQw4w9WgXcQ", "transcript": "talk.vtt"},
        {"url": f"{site}/empty"},
    ]
    path.write_text(
        json.dumps({"vault": str(vault), "turns": [{"user": "read", "attach": attach}]}),
        encoding="utf-8",
    )
    return path


def expected(site: str) -> list[tuple[str, str, str]]:
    return [(c, k.format(site=site), m) for c, k, m in EXPECTED]


def test_every_warning_kind_is_in_the_trace(script: Path, site: str) -> None:
    result = lamina("run", str(script), "--json", "--allow-private-network")
    assert result.returncode == 0, result.stderr
    (turn,) = json.loads(result.stdout)["turns"]
    assert [(w["code"], w["key"], w["message"]) for w in turn["warnings"]] == expected(site)
    assert result.stderr == ""  # the JSON output carries them; stderr stays quiet


def test_every_warning_kind_is_on_stderr_in_human_output(script: Path, site: str) -> None:
    result = lamina("run", str(script), "--allow-private-network")
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == [
        f"lamina: warning: turn 1: {key}: {message} [{code}]"
        for code, key, message in expected(site)
    ]


def test_every_warning_kind_is_in_inspect(script: Path, site: str) -> None:
    result = lamina("inspect", str(script), "--allow-private-network")
    assert result.returncode == 0, result.stderr
    shown = " ".join(result.stdout.split())
    for code, key, message in expected(site):
        assert f"warning: {key}: {message} [{code}]" in shown
    assert len(result.stderr.splitlines()) == len(EXPECTED)
