"""Start a real ``lamina serve`` on 127.0.0.1 (a free port) for a test, and talk to it."""

from __future__ import annotations

import contextlib
import copy
import re
import resource
import select
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from lamina._cli import DEMO_SCRIPT

ROOT = Path(__file__).resolve().parents[2]
VAULT = ROOT / "examples" / "vault"

# The demo's conversation: notes, a folder, a tag, a PDF, a video, a selection, steady state.
WALKTHROUGH: dict[str, Any] = copy.deepcopy(DEMO_SCRIPT)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def serve_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "lamina._cli", "serve", *args]


LISTENING = re.compile(r"^lamina serve: listening on (http://\S+) ")


@contextlib.contextmanager
def running(
    store: Path | str, *args: str, token: str | None = None, files: int | None = None
) -> Iterator[str]:
    """``lamina serve --store STORE ARGS`` on a port the system picks until the block
    ends; yields the base URL it prints (STORE: a SQLite file or a postgresql:// URL).
    ``files`` caps the server's open descriptors (soft and hard limit)."""

    def limit() -> None:
        if files is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (files, files))

    # The log goes to a file: a pipe nobody reads could fill and block the server.
    with tempfile.TemporaryFile(mode="w+", encoding="utf-8") as log:
        proc = subprocess.Popen(
            serve_command("--port", "0", "--store", str(store), *args),
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            preexec_fn=limit,
        )
        headers = {} if token is None else {"Authorization": f"Bearer {token}"}
        try:
            assert proc.stdout is not None
            ready, _, _ = select.select([proc.stdout], [], [], 60)
            first = proc.stdout.readline() if ready else ""
            found = LISTENING.match(first)
            if found is None:
                proc.kill()
                proc.wait()
                log.seek(0)
                err = log.read()
                raise RuntimeError(f"lamina serve did not start: {first!r} {err}")
            base = found.group(1)
            for _ in range(600):
                if proc.poll() is not None:
                    log.seek(0)
                    raise RuntimeError(f"lamina serve exited: {log.read()}")
                try:
                    health = httpx.get(f"{base}/v1/health", headers=headers, timeout=1)
                    if health.status_code == 200:
                        break
                except httpx.TransportError:
                    time.sleep(0.1)
            else:
                raise RuntimeError("lamina serve did not answer")
            yield base
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stdout:
                proc.stdout.close()


def create(client: httpx.Client, **settings: Any) -> dict[str, Any]:
    response = client.post("/v1/conversations", json=settings)
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


def turn(client: httpx.Client, cid: str, head: dict[str, Any], **body: Any) -> dict[str, Any]:
    response = client.post(f"/v1/conversations/{cid}/turns", json={"parent": head, **body})
    assert response.status_code == 200, response.text
    out: dict[str, Any] = response.json()
    return out


def reply(client: httpx.Client, cid: str, head: dict[str, Any], text: str) -> dict[str, Any]:
    response = client.post(f"/v1/conversations/{cid}/reply", json={"parent": head, "text": text})
    assert response.status_code == 200, response.text
    out: dict[str, Any] = response.json()["head"]
    return out


def run_turns(
    client: httpx.Client, cid: str, head: dict[str, Any], turns: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Each scripted turn through the API (with its reply); the turns and the last head."""
    out = []
    for t in turns:
        extra = {k: v for k, v in t.items() if k not in ("user", "reply")}
        built = turn(client, cid, head, user=t["user"], **extra)
        out.append(built)
        head = built["head"]
        if t.get("reply") is not None:
            head = reply(client, cid, head, t["reply"])
    return out, head
