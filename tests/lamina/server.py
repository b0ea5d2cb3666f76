"""Start a real ``lamina serve`` on 127.0.0.1 (a free port) for a test, and talk to it."""

from __future__ import annotations

import contextlib
import copy
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from lamina._cli import DEMO_SCRIPT

ROOT = Path(__file__).resolve().parents[2]
VAULT = ROOT / "examples" / "vault"

# The demo's own conversation (four turns: notes, a folder, a tag, a PDF, a video, a selection).
WALKTHROUGH: dict[str, Any] = copy.deepcopy(DEMO_SCRIPT)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def serve_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "lamina._cli", "serve", *args]


@contextlib.contextmanager
def running(store: Path | str, *args: str, token: str | None = None) -> Iterator[str]:
    """``lamina serve --store STORE ARGS`` until the block ends; yields its base URL
    (STORE: a SQLite file or a postgresql:// URL)."""
    port = free_port()
    proc = subprocess.Popen(
        serve_command("--port", str(port), "--store", str(store), *args),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    try:
        for _ in range(600):
            if proc.poll() is not None:
                err = proc.stderr.read() if proc.stderr else ""
                raise RuntimeError(f"lamina serve exited: {err}")
            try:
                if httpx.get(f"{base}/v1/health", headers=headers, timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        else:
            raise RuntimeError("lamina serve did not start")
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stderr:
            proc.stderr.close()


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
