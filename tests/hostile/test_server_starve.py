"""Clients that never finish, against a real ``lamina serve`` on 127.0.0.1 with a bearer
token, on both HTTP parsers: idle kept-alive connections at the cap, answers nobody reads,
heads past the cap, smuggled framing. While the hostile clients run, a fresh client is
served within a bound (issue 36, items 1, 2, 6 and 11)."""

from __future__ import annotations

import contextlib
import select
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from lamina._protocols import MAX_HEAD_BYTES, MAX_PIPELINED
from tests.hostile.test_server import PARSERS, _address, _answer, _closed
from tests.lamina.server import running

TOKEN = "a-token-for-the-starving-tests-0123"
HEALTH = b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"  # no token: a 401


@contextlib.contextmanager
def _serving(tmp_path: Path, parser: str, *args: str) -> Iterator[str]:
    (tmp_path / "token").write_text(TOKEN, encoding="utf-8")
    with running(
        tmp_path / "s.sqlite",
        "--token-file",
        str(tmp_path / "token"),
        "--http",
        parser,
        *args,
        token=TOKEN,
    ) as url:
        yield url


def _fresh(url: str) -> tuple[int, float]:
    """A new client's status for ``GET /v1/health`` with the token, and how long it took
    (503 on a refused connection, 0 when it was dropped)."""
    started = time.monotonic()
    try:
        response = httpx.get(
            f"{url}/v1/health", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5
        )
        status = response.status_code
    except httpx.TransportError:
        status = 0
    return status, time.monotonic() - started


def _served(url: str, within: float = 3.0) -> tuple[int, float]:
    """``_fresh`` again after a 503 (the server was answering every other connection's
    request), for up to ``within`` seconds: the status and the time until served."""
    started = time.monotonic()
    status = 503
    while status == 503 and time.monotonic() - started < within:
        status, _ = _fresh(url)
        if status == 503:
            time.sleep(0.25)
    return status, time.monotonic() - started


def _connect(url: str, receive_buffer: int = 0) -> socket.socket:
    s = socket.socket()
    if receive_buffer:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    s.settimeout(5)
    s.connect(_address(url))
    s.setblocking(False)
    return s


def _drain(s: socket.socket) -> bytes:
    """What the server sent on ``s`` so far (without waiting)."""
    got = b""
    with contextlib.suppress(BlockingIOError, OSError):
        while more := s.recv(65536):
            got += more
    return got


@PARSERS
def test_idle_kept_alive_connections_at_the_cap_make_room_for_a_new_client(
    tmp_path: Path, parser: str
) -> None:
    """8 clients fill ``--max-connections 8``, each kept alive by an unauthenticated
    request (401) every 2 s, under the 5 s keep-alive timeout. A new client every half
    second for 5 s is served each time, within 2 s: the idle connection that waited
    longest is closed for it."""
    with _serving(tmp_path, parser, "--max-connections", "8") as url:
        hostile = [_connect(url) for _ in range(8)]
        for s in hostile:
            s.send(HEALTH)
        served = []
        sent_at = time.monotonic()
        for _ in range(10):  # bounded: ten fresh clients, half a second apart
            if time.monotonic() - sent_at >= 2:
                for i, s in enumerate(hostile):
                    if _closed(s):  # closed for a fresh client: the hostile one comes back
                        s.close()
                        hostile[i] = s = _connect(url)
                    with contextlib.suppress(OSError):
                        s.send(HEALTH)
                sent_at = time.monotonic()
            served.append(_fresh(url))
            for s in hostile:
                _drain(s)
            time.sleep(0.5)
        for s in hostile:
            s.close()
    assert [status for status, _ in served] == [200] * 10, served
    assert max(seconds for _, seconds in served) < 2, served


def _big_conversation(url: str) -> str:
    """A conversation whose trace is about 1 MB (one 900 kB note): the path of its trace."""
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=url, headers=headers, timeout=60) as c:
        cid = c.post("/v1/conversations", json={"vault": False}).json()["id"]
        note = {"path": "big.md", "content": "word " * 180_000}
        built = c.post(
            f"/v1/conversations/{cid}/turns",
            json={
                "parent": {"turn": 0, "hash": ""},
                "user": "read it",
                "attach": [{"note": "big.md"}],
                "notes": [note],
            },
        )
        assert built.status_code == 200, built.text
    return f"/v1/conversations/{cid}/turns/1/trace"


@PARSERS
def test_answers_nobody_reads_are_dropped_at_the_write_deadline(
    tmp_path: Path, parser: str
) -> None:
    """8 connections fill ``--max-connections 8``, each pipelining ten 1 MB traces with a
    4 KB receive buffer and never reading: a fresh client is served within 3 s each time
    (a connection whose answer does not drain is closed for it), and a stalled connection
    is dropped within the 2 s write deadline (plus slack) even without new clients."""
    with _serving(tmp_path, parser, "--max-connections", "8", "--write-timeout", "2") as url:
        trace = _big_conversation(url)
        request = (
            f"GET {trace} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\n\r\n"
        ).encode()
        hostile = [_connect(url, receive_buffer=4096) for _ in range(8)]
        for s in hostile:
            with contextlib.suppress(OSError):
                s.send(request * 10)
        time.sleep(1)  # the answers are written and stall
        served = [_fresh(url) for _ in range(3)]
        started = time.monotonic()
        lone = hostile[-1]
        while not _closed(lone) and time.monotonic() - started < 15:  # never read: EOF/reset
            time.sleep(0.25)
        dropped_after = time.monotonic() - started
        for s in hostile:
            s.close()
    assert [status for status, _ in served] == [200] * 3, served
    assert max(seconds for _, seconds in served) < 3, served
    # Never dropped, the loop above ends at 15 s. The kernel takes a few more KB into its
    # socket buffers in the first seconds of the stall: progress, which arms a new
    # deadline (6.08 s measured on an idle machine, under the 6 s this asserted before).
    assert dropped_after < 9


@PARSERS
def test_pipelined_requests_nobody_reads_leave_the_server_answering(
    tmp_path: Path, parser: str
) -> None:
    """8 connections each pipeline 20,000 unauthenticated ``GET /v1/health`` (0.9 MB)
    with a 4 KB receive buffer and never read: fresh clients are served within 3 s (503
    while every connection's queued requests are being answered), and
    each hostile connection is closed within 15 s (httptools after answering the requests
    it queued, at most MAX_PIPELINED behind the first; h11, one request at a time, at the
    write deadline)."""
    with _serving(tmp_path, parser, "--max-connections", "8", "--write-timeout", "2") as url:
        hostile = [_connect(url, receive_buffer=4096) for _ in range(8)]
        for s in hostile:
            s.setblocking(True)
            s.settimeout(0.5)
            with contextlib.suppress(OSError):
                s.sendall(HEALTH * 20_000)
            s.setblocking(False)
        # While all 8 are answering the requests they queued the cap is held by work in
        # progress (503), which is bounded: a new client is served within 3 s.
        served = [_served(url) for _ in range(3)]
        started = time.monotonic()
        open_ = list(hostile)
        while open_ and time.monotonic() - started < 15:
            open_ = [s for s in open_ if not _closed(s)]
            time.sleep(0.25)
        for s in hostile:
            s.close()
    assert [status for status, _ in served] == [200] * 3, served
    assert max(seconds for _, seconds in served) < 3, served
    assert not open_


def test_httptools_answers_the_pipelined_requests_it_queued_then_closes(
    tmp_path: Path,
) -> None:
    """A connection that pipelines more than MAX_PIPELINED requests behind the first gets
    exactly that many answers plus the first, the last marked ``connection: close``."""
    with _serving(tmp_path, "httptools") as url:
        s = socket.create_connection(_address(url), timeout=10)
        s.sendall(HEALTH * (MAX_PIPELINED + 20))
        answer = b""
        while more := s.recv(65536):
            answer += more
        s.close()
    assert answer.count(b"HTTP/1.1 401 ") == MAX_PIPELINED + 1
    assert answer.count(b"connection: close") == 1


@PARSERS
def test_a_head_past_the_cap_is_431_and_read_no_further(tmp_path: Path, parser: str) -> None:
    """Four connections each stream one header of up to 48 MB: each is answered 431 and
    closed long before 48 MB are sent, while a fresh client is served; a head
    just under the cap is answered as usual."""
    with _serving(tmp_path, parser) as url:
        hostile = [_connect(url) for _ in range(4)]
        for s in hostile:
            s.send(b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: ")
        answers = [bytearray() for _ in hostile]
        sent = [0] * len(hostile)
        piece = b"a" * 65536
        # Bounded by 48 MB a connection and by time, not by rounds: where the server reads
        # slowly (a loaded machine) the sends block, and rounds counted then ran out in
        # milliseconds, before the server had read the cap (one connection in 200 under
        # load gave up unanswered).
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            live = [s for s, a in zip(hostile, answers, strict=True) if not _closed(s, a)]
            if not live:
                break
            more = [s for s in live if sent[hostile.index(s)] < 48 << 20]
            _, writable, _ = select.select(live, more, [], 0.5)
            for s in writable:
                with contextlib.suppress(OSError):
                    sent[hostile.index(s)] += s.send(piece)
        served = _fresh(url)
        for s in hostile:
            s.close()
        under = socket.create_connection(_address(url), timeout=10)
        filler = b"x" * (MAX_HEAD_BYTES - 1024)
        under.sendall(
            b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer "
            + TOKEN.encode()
            + b"\r\nX-Filler: "
            + filler
            + b"\r\n\r\n"
        )
        under_answer = _answer(under)
        under.close()
    assert all(bytes(a).startswith(b"HTTP/1.1 431 ") for a in answers), [a[:40] for a in answers]
    assert max(sent) < 16 << 20, sent  # the cap, plus what the sockets' buffers held
    assert served[0] == 200 and served[1] < 3, served
    assert under_answer.startswith(b"HTTP/1.1 200 "), under_answer[:100]


@PARSERS
def test_transfer_encoding_with_content_length_is_refused_and_closed(
    tmp_path: Path, parser: str
) -> None:
    """A body framed both ways (RFC 9112 6.3, a smuggling attempt) is 400 and the
    connection closes: what follows the chunked body is never read as a request."""
    smuggled = b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    with _serving(tmp_path, parser) as url:
        s = socket.create_connection(_address(url), timeout=10)
        s.sendall(
            b"POST /v1/conversations HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            + f"Authorization: Bearer {TOKEN}\r\n".encode()
            + b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
            + b"Content-Length: 6\r\n\r\n2\r\n{}\r\n0\r\n\r\n"
            + smuggled
        )
        answer = b""
        while more := s.recv(65536):  # the server closes: the loop ends (timeout 10 s)
            answer += more
        s.close()
        served = _fresh(url)
    assert answer.startswith(b"HTTP/1.1 400 "), answer[:200]
    assert answer.count(b"HTTP/1.1 ") == 1
    assert served[0] == 200 and served[1] < 3
