"""Hostile clients of a real ``lamina serve`` on 127.0.0.1: rebound DNS names, slow and
half-sent requests, text that is not Unicode, oversize chunked bodies, never-answering
pages. Each probe ends with the server still answering."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.lamina.server import ROOT, VAULT, running

EMPTY = {"turn": 0, "hash": ""}


def _address(base: str) -> tuple[str, int]:
    host, _, port = base.removeprefix("http://").rpartition(":")
    return host, int(port)


# -- DNS rebinding ------------------------------------------------------------------------


def test_without_a_token_a_foreign_host_or_origin_is_refused(tmp_path: Path) -> None:
    """A page whose name was rebound to 127.0.0.1 sends its own name as Host: 403, and
    nothing is created or read."""
    with running(tmp_path / "s.sqlite", "--vault", str(VAULT)) as url:
        port = _address(url)[1]
        with httpx.Client(base_url=url, timeout=60) as c:
            rebound = c.post(
                "/v1/conversations", json={}, headers={"Host": f"attacker.example:{port}"}
            )
            assert rebound.status_code == 403
            assert rebound.json()["field"] == "host"
            cross_site = c.post(
                "/v1/conversations", json={}, headers={"Origin": "http://attacker.example"}
            )
            assert cross_site.status_code == 403
            assert cross_site.json()["field"] == "origin"
            null_origin = c.get("/v1/conversations", headers={"Origin": "null"})
            assert null_origin.status_code == 403
            assert c.get("/v1/conversations").json() == {"conversations": []}
            for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}", "LOCALHOST."):
                assert c.get("/v1/health", headers={"Host": host}).status_code == 200, host
            same_origin = {"Host": f"localhost:{port}", "Origin": f"http://localhost:{port}"}
            assert c.get("/v1/conversations", headers=same_origin).status_code == 200


def test_an_allowed_host_name_is_answered_and_a_token_server_checks_the_token(
    tmp_path: Path,
) -> None:
    with running(tmp_path / "s.sqlite", "--allow-host", "lamina.internal") as url:
        named = httpx.get(f"{url}/v1/health", headers={"Host": "lamina.internal:1"}, timeout=60)
        assert named.status_code == 200
        other = httpx.get(f"{url}/v1/health", headers={"Host": "other.internal"}, timeout=60)
        assert other.status_code == 403
    token = "a-token-for-the-hostile-tests-0123"
    (tmp_path / "token").write_text(token, encoding="utf-8")
    with running(
        tmp_path / "t.sqlite", "--token-file", str(tmp_path / "token"), token=token
    ) as url:
        headers = {"Host": "anything.example", "Authorization": f"Bearer {token}"}
        assert httpx.get(f"{url}/v1/health", headers=headers, timeout=60).status_code == 200
        del headers["Authorization"]
        assert httpx.get(f"{url}/v1/health", headers=headers, timeout=60).status_code == 401


# -- slow clients -------------------------------------------------------------------------


def _connect(base: str) -> socket.socket:
    s = socket.create_connection(_address(base), timeout=5)
    s.setblocking(False)
    return s


def _closed(s: socket.socket, answer: bytearray | None = None) -> bool:
    """Whether the server ended this connection (EOF or reset) by now; what it sent
    before is added to ``answer``."""
    try:
        while data := s.recv(65536):
            if answer is not None:
                answer += data
        return True
    except BlockingIOError:
        return False
    except OSError:
        return True


def _drip(sockets: list[socket.socket], byte: bytes) -> None:
    for s in sockets:
        with contextlib.suppress(OSError):
            s.send(byte)


# Every guard holds for both HTTP parsers `lamina serve --http` offers.
PARSERS = pytest.mark.parametrize("parser", ["httptools", "h11"])


@PARSERS
def test_a_request_head_dripped_a_byte_a_second_is_cut_off(tmp_path: Path, parser: str) -> None:
    with running(tmp_path / "s.sqlite", "--header-timeout", "2", "--http", parser) as url:
        s = _connect(url)
        s.send(b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        started = time.monotonic()
        answer = bytearray()
        while not _closed(s, answer) and time.monotonic() - started < 15:  # 15 bytes at most
            _drip([s], b"X")
            time.sleep(1)
        assert time.monotonic() - started < 6
        assert answer.startswith(b"HTTP/1.1 408 "), bytes(answer)
        s.close()


@PARSERS
def test_a_request_body_dripped_a_byte_a_second_is_cut_off(tmp_path: Path, parser: str) -> None:
    with running(tmp_path / "s.sqlite", "--body-timeout", "2", "--http", parser) as url:
        s = _connect(url)
        s.send(
            b"POST /v1/conversations HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"
        )
        started = time.monotonic()
        while not _closed(s) and time.monotonic() - started < 15:
            _drip([s], b" ")
            time.sleep(1)
        assert time.monotonic() - started < 6
        s.close()
        assert httpx.get(f"{url}/v1/conversations", timeout=60).json() == {"conversations": []}


@PARSERS
def test_half_sent_requests_beyond_the_descriptor_limit_leave_health_answering(
    tmp_path: Path, parser: str
) -> None:
    """148 connections dripping their request heads at a server limited to 128 descriptors:
    /v1/health still answers within a few seconds, every time."""
    with running(tmp_path / "s.sqlite", "--http", parser, files=128) as url:
        slow = [_connect(url) for _ in range(148)]
        try:
            _drip(slow, b"GET /v1/health HTTP/1.1\r\n")
            answered = []
            for _ in range(4):  # bounded: four rounds, one byte a second on every socket
                _drip(slow, b"X")
                started = time.monotonic()
                response = httpx.get(f"{url}/v1/health", timeout=5)
                answered.append((response.status_code, time.monotonic() - started))
                time.sleep(1)
        finally:
            for s in slow:
                s.close()
        assert [status for status, _ in answered] == [200] * 4
        assert max(seconds for _, seconds in answered) < 3


def _answer(s: socket.socket) -> bytes:
    """Everything the server sends on ``s`` until it closes it or the answer is whole."""
    s.setblocking(True)
    s.settimeout(30)
    answer = b""
    while not (b"\r\n\r\n" in answer and answer.endswith((b"ok", b"\r\n\r\n"))):
        try:
            more = s.recv(65536)
        except OSError:
            break
        if not more:
            break
        answer += more
    return answer


@PARSERS
def test_at_the_connection_cap_the_oldest_waiting_connection_makes_room(
    tmp_path: Path, parser: str
) -> None:
    """--max-connections 2: a third connection closes the oldest one still sending its
    head (408) and is answered; idle kept-alive connections make room the same way,
    oldest first, closed without an answer (none was asked for)."""
    with running(tmp_path / "s.sqlite", "--max-connections", "2", "--http", parser) as url:
        first, second = _connect(url), _connect(url)
        for s in (first, second):
            s.send(b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # half a head
        time.sleep(1)  # both are the server's before the third arrives
        third = _connect(url)
        third.send(b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert _answer(third).startswith(b"HTTP/1.1 200 ")
        assert _answer(first).startswith(b"HTTP/1.1 408 ")
        for s in (first, second, third):
            s.close()
        time.sleep(1)  # the server has let the three go
        idle = [_connect(url), _connect(url)]
        for s in idle:
            s.send(b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert _answer(s).startswith(b"HTTP/1.1 200 ")  # kept alive, not waiting
        time.sleep(0.2)
        fresh = _connect(url)
        fresh.send(b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert _answer(fresh).startswith(b"HTTP/1.1 200 ")
        assert _answer(idle[0]) == b""  # the oldest idle one: closed, nothing sent
        for s in (*idle, fresh):
            s.close()


# -- text that is not Unicode -------------------------------------------------------------


def _raw_json(client: httpx.Client, path: str, text: str) -> httpx.Response:
    """POST ``text`` as is: JSON may spell a lone surrogate (``"\\ud800"``)."""
    return client.post(path, content=text.encode(), headers={"Content-Type": "application/json"})


def test_a_lone_surrogate_is_a_json_error_and_the_conversation_stays_readable(
    tmp_path: Path,
) -> None:
    with running(tmp_path / "s.sqlite") as url, httpx.Client(base_url=url, timeout=60) as c:
        cid = c.post("/v1/conversations", json={}).json()["id"]
        turns = f"/v1/conversations/{cid}/turns"
        bad_user = _raw_json(c, turns, '{"parent": {"turn": 0, "hash": ""}, "user": "a\\ud800"}')
        assert bad_user.status_code == 422
        assert bad_user.json()["field"] == "user"
        assert "surrogate" in bad_user.json()["error"]
        bad_note = _raw_json(
            c,
            turns,
            '{"parent": {"turn": 0, "hash": ""}, "user": "x", "attach": [{"note": "\\udcff"}]}',
        )
        assert bad_note.status_code == 422
        assert bad_note.json()["field"] == "attach[0].note"
        built = c.post(turns, json={"parent": EMPTY, "user": "fine"}).json()
        bad_reply = _raw_json(
            c,
            f"/v1/conversations/{cid}/reply",
            json.dumps({"parent": built["head"], "text": "X"}).replace("X", "\\udfff"),
        )
        assert bad_reply.status_code == 422
        assert bad_reply.json()["field"] == "text"
        bad_title = _raw_json(c, "/v1/conversations", '{"title": "\\ud800"}')
        assert bad_title.status_code == 422
        transcript = c.get(f"/v1/conversations/{cid}/transcript")
        assert transcript.status_code == 200
        assert "fine" in transcript.json()["markdown"]
        assert c.get(f"/v1/conversations/{cid}").json()["head"] == built["head"]


# -- oversize bodies ----------------------------------------------------------------------


def _chunked(base: str, path: str, total: int) -> bytes:
    """POST ``total`` bytes with chunked transfer encoding; the response head and body."""
    s = socket.create_connection(_address(base), timeout=30)
    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    s.sendall(head.encode() + b"Transfer-Encoding: chunked\r\n\r\n")
    chunk = b"x" * 65536
    sent = 0
    answer = b""
    s.setblocking(False)
    while sent < total and not answer:
        with contextlib.suppress(BlockingIOError):
            answer = s.recv(65536)
        if answer:
            break
        s.setblocking(True)
        s.sendall(b"%x\r\n%b\r\n" % (len(chunk), chunk))
        s.setblocking(False)
        sent += len(chunk)
    s.setblocking(True)
    with contextlib.suppress(OSError):
        s.sendall(b"0\r\n\r\n")
    s.settimeout(30)
    while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
        more = s.recv(65536)
        if not more:
            break
        answer += more
    s.close()
    return answer


@PARSERS
def test_an_oversize_chunked_body_is_413(tmp_path: Path, parser: str) -> None:
    with running(tmp_path / "s.sqlite", "--http", parser) as url:
        answer = _chunked(url, "/v1/conversations", 9 << 20)  # 9 MiB over the 8 MiB cap
        assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]
        body = json.loads(answer.partition(b"\r\n\r\n")[2])
        assert body["field"] == "body" and body["status"] == 413
        assert httpx.get(f"{url}/v1/health", timeout=60).status_code == 200


# -- never-answering pages ----------------------------------------------------------------


@contextlib.contextmanager
def _silent_server() -> Iterator[str]:
    """An HTTP address that accepts connections and never answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(128)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            with contextlib.suppress(TimeoutError, OSError):
                held.append(listener.accept()[0])

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/never.html"
    finally:
        stop.set()
        thread.join()
        for s in held:
            s.close()
        listener.close()


def test_never_answering_urls_do_not_starve_other_conversations(tmp_path: Path) -> None:
    # The silent page closes first (its connections with it), so the fetches end at once.
    with (
        running(tmp_path / "s.sqlite", "--allow-private-network") as url,
        httpx.Client(base_url=url, timeout=60) as c,
        _silent_server() as never,
    ):
        ids = [c.post("/v1/conversations", json={}).json()["id"] for _ in range(18)]
        warm = c.post(f"/v1/conversations/{ids[17]}/turns", json={"parent": EMPTY, "user": "hi"})
        assert warm.status_code == 200  # the first turn's imports are not what is measured
        waiting: list[Any] = []

        def fetch(cid: str) -> None:
            with httpx.Client(base_url=url, timeout=60) as mine:
                body = {"parent": EMPTY, "user": "read", "attach": [{"url": never}]}
                waiting.append(mine.post(f"/v1/conversations/{cid}/turns", json=body))

        threads = [threading.Thread(target=fetch, args=(cid,)) for cid in ids[:16]]
        for t in threads:
            t.start()
        time.sleep(1.5)  # every fetch has started and hangs
        started = time.monotonic()
        plain = c.post(f"/v1/conversations/{ids[16]}/turns", json={"parent": EMPTY, "user": "hi"})
        elapsed = time.monotonic() - started
        assert plain.status_code == 200
        assert elapsed < 3, f"a plain turn waited {elapsed:.1f} s behind URL fetches"
        assert not waiting  # the fetches were still hanging meanwhile
    for t in threads:
        t.join()
    assert len(waiting) == 16


# -- start-up -----------------------------------------------------------------------------


def test_serve_without_the_server_extra_is_one_line_and_exit_2(tmp_path: Path) -> None:
    block = "import sys; sys.modules['fastapi'] = None; from lamina._cli import main; "
    code = block + f"sys.exit(main(['serve', '--store', {str(tmp_path / 's.sqlite')!r}]))"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1
    assert done.stderr.startswith("lamina: error: serve: needs the server extra")
    assert "pip install 'lamina[server]'" in done.stderr
    assert not (tmp_path / "s.sqlite").exists()


def test_serve_help_cites_only_documents_that_exist() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "lamina._cli", "serve", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0
    assert "docs/SERVER.md" in done.stdout
    assert (ROOT / "docs" / "SERVER.md").is_file()
    for option in ("--allow-host", "--header-timeout", "--body-timeout", "--max-connections"):
        assert option in done.stdout


@pytest.mark.parametrize("workers", ["1", "2"])
def test_serve_prints_where_it_listens(tmp_path: Path, workers: str) -> None:
    """``running`` reads the address from the first line the server prints."""
    with running(tmp_path / "s.sqlite", "--workers", workers) as url:
        assert url.startswith("http://127.0.0.1:")
        assert httpx.get(f"{url}/v1/health", timeout=60).text == "ok"
