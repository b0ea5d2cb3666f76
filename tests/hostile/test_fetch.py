"""Hostile web servers on 127.0.0.1: headers dripped a byte at a time, slow redirect chains,
compression bombs (generated here), and addresses that hide loopback inside IPv6."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import tracemalloc
import zlib
from collections.abc import Callable, Iterator

import pytest

from lamina.pipeline.errors import FetchError
from lamina.processors import ProcessContext, UrlPayload, UrlProcessor, url
from tests.hostile.corpus import assert_one_error_line, lamina_limited

Handler = Callable[[socket.socket], None]


class RawServer:
    """A TCP server on 127.0.0.1 that hands each connection to ``handler`` and counts the
    bytes handlers manage to send before the client goes away."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.sent = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def url(self, path: str = "/") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            request = b""
            while b"\r\n\r\n" not in request:
                data = conn.recv(4096)
                if not data:
                    return
                request += data
            with contextlib.suppress(OSError):  # the client hung up: what these servers test
                self.handler(conn)

    def send(self, conn: socket.socket, data: bytes) -> None:
        conn.sendall(data)
        self.sent += len(data)

    def close(self) -> None:
        self.stop.set()
        self.listener.close()


@pytest.fixture
def serve() -> Iterator[Callable[[Handler], RawServer]]:
    servers: list[RawServer] = []

    def start(handler: Handler) -> RawServer:
        servers.append(RawServer(handler))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


PAGE = b"<html><head><title>Fine</title></head><body><article><p>" + b"Real text. " * 40
PAGE += b"</p></article></body></html>"


def _headers(body_length: int | None, extra: str = "") -> bytes:
    head = "HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\n"
    if body_length is not None:
        head += f"Content-Length: {body_length}\r\n"
    return (head + extra + "Connection: close\r\n\r\n").encode()


def _ctx(**options: float) -> ProcessContext:
    return ProcessContext(allow_private_network=True, options=dict(options))


def _error(u: str, ctx: ProcessContext) -> FetchError:
    with pytest.raises(FetchError) as info:
        UrlProcessor().process(url(u), ctx)
    return info.value


def _fetch(u: str, ctx: ProcessContext) -> UrlPayload:
    (artifact,) = UrlProcessor().process(url(u), ctx).artifacts
    assert isinstance(artifact.payload, UrlPayload)
    return artifact.payload


def _drip(server: Callable[[], RawServer], data: bytes, pause: float) -> Handler:
    def handler(conn: socket.socket) -> None:
        for i in range(len(data)):
            server().send(conn, data[i : i + 1])
            time.sleep(pause)

    return handler


def test_headers_dripped_a_byte_at_a_time_stop_at_the_deadline(
    serve: Callable[[Handler], RawServer],
) -> None:
    """Each byte comes well within the read timeout; only the overall deadline can stop it."""
    response = _headers(len(PAGE)) + b"X-Padding: " + b"p" * 400 + b"\r\n" + PAGE
    server: RawServer = serve(_drip(lambda: server, response, 0.02))
    error = _error(server.url(), _ctx(url_timeout=0.5, url_deadline=1.0))
    assert error.reason == "timeout"
    assert "1 s deadline" in str(error)
    time.sleep(0.1)
    assert server.sent < len(response) // 2  # cut off, not read to the end


def test_the_deadline_covers_every_hop_of_a_redirect_chain(
    serve: Callable[[Handler], RawServer],
) -> None:
    """Three hops, each dripping for ~0.6 s: each alone is within a 1 s deadline, together not."""
    final: RawServer = serve(_drip(lambda: final, _headers(len(PAGE)) + PAGE, 0.001))
    hops: list[RawServer] = []
    target = final.url()
    for _ in range(3):
        redirect = f"HTTP/1.1 302 Found\r\nLocation: {target}\r\nX-Pad: {'p' * 30}\r\n"
        redirect += "Content-Length: 0\r\nConnection: close\r\n\r\n"
        box: list[RawServer] = []
        hops.append(serve(_drip(lambda b=box: b[0], redirect.encode(), 0.006)))
        box.append(hops[-1])
        target = hops[-1].url()
    error = _error(target, _ctx(url_timeout=0.5, url_deadline=1.0))
    assert error.reason == "timeout"
    assert final.sent == 0  # the last hop was never reached


def test_a_body_dripped_a_byte_at_a_time_stops_at_the_deadline(
    serve: Callable[[Handler], RawServer],
) -> None:
    body = PAGE * 4

    def handler(conn: socket.socket) -> None:
        server.send(conn, _headers(len(body)))
        _drip(lambda: server, body, 0.01)(conn)

    server = serve(handler)
    error = _error(server.url(), _ctx(url_timeout=0.5, url_deadline=1.0))
    assert error.reason == "timeout"
    time.sleep(0.1)
    assert server.sent < len(body) // 2


@pytest.mark.parametrize("framing", ["close-delimited", "chunked"])
def test_a_body_without_a_length_dripped_past_the_deadline_is_an_error_not_a_cut_page(
    serve: Callable[[Handler], RawServer], framing: str
) -> None:
    """No Content-Length: the body ends when the connection does. The server sends 15
    bytes and then holds the connection; the deadline's shutdown ends the read as quietly
    as a close, and that end used to read as the page's: its first 15 bytes came back as
    the whole page, exit 0, no warning."""
    head, rest = b"<p>first bytes ", b"and the rest of the page.</p>" + PAGE
    extra = "Transfer-Encoding: chunked\r\n" if framing == "chunked" else ""

    def framed(data: bytes) -> bytes:
        return f"{len(data):x}\r\n".encode() + data + b"\r\n" if extra else data

    def handler(conn: socket.socket) -> None:
        server.send(conn, _headers(None, extra) + framed(head))
        time.sleep(3)
        server.send(conn, framed(rest) + (b"0\r\n\r\n" if extra else b""))

    server = serve(handler)
    error = _error(server.url(), _ctx(url_timeout=5.0, url_deadline=1.0))
    assert error.reason == "timeout"
    assert "1 s deadline" in str(error)


def gzip_zeros(megabytes: int) -> bytes:
    """A gzip stream of ``megabytes`` MiB of zeros, built from one repeated flushed block
    (its trailer is wrong: a client that honours its cap never gets there)."""
    deflate = zlib.compressobj(9, zlib.DEFLATED, 31)
    chunk = bytes(1 << 20)
    head = deflate.compress(chunk) + deflate.flush(zlib.Z_FULL_FLUSH)
    block = deflate.compress(chunk) + deflate.flush(zlib.Z_FULL_FLUSH)
    return head + block * (megabytes - 1) + deflate.flush()


def gzip(data: bytes) -> bytes:
    return zlib.compress(data, 9, wbits=31)


def _static(body: bytes, encoding: str) -> Handler:
    def handler(conn: socket.socket) -> None:
        conn.sendall(_headers(len(body), f"Content-Encoding: {encoding}\r\n") + body)

    return handler


def test_a_doubly_gzipped_4_gib_body_is_capped_while_decoding(
    serve: Callable[[Handler], RawServer],
) -> None:
    bomb = gzip(gzip_zeros(4096))  # 4 GiB of zeros in about 10 KB
    assert len(bomb) < 50_000
    server = serve(_static(bomb, "gzip, gzip"))
    tracemalloc.start()
    try:
        error = _error(server.url(), _ctx(url_max_bytes=1_000_000))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert error.reason == "too-large"
    assert peak < 12_000_000  # a few times the 1 MB cap, not gigabytes


def test_a_gzip_bomb_through_the_cli_is_one_error_line_under_ulimit(
    serve: Callable[[Handler], RawServer], tmp_path: pytest.TempPathFactory
) -> None:
    server = serve(_static(gzip(gzip_zeros(4096)), "gzip, gzip"))
    script = tmp_path / "s.json"  # type: ignore[operator]
    script.write_text(f'{{"turns": [{{"user": "q", "attach": [{{"url": "{server.url()}"}}]}}]}}')
    result = lamina_limited("run", str(script), "--allow-private-network")
    assert_one_error_line(result, "too-large", "5,000,000-byte cap")


@pytest.mark.parametrize(
    ("encoding", "encode"),
    [
        ("gzip", gzip),
        ("x-gzip", gzip),
        ("deflate", lambda b: zlib.compress(b, 9)),
        ("deflate", lambda b: zlib.compress(b, 9, wbits=-15)),  # raw, as some servers send
        ("gzip, gzip", lambda b: gzip(gzip(b))),
        ("deflate, gzip", lambda b: gzip(zlib.compress(b))),
        ("identity", lambda b: b),
    ],
)
def test_compressed_pages_still_decode(
    serve: Callable[[Handler], RawServer], encoding: str, encode: Callable[[bytes], bytes]
) -> None:
    server = serve(_static(encode(PAGE), encoding))
    page = _fetch(server.url(), _ctx())
    assert page.title == "Fine"
    assert "Real text." in page.text


@pytest.mark.parametrize("encoding", ["br", "gzip, gzip, gzip, gzip", "compress"])
def test_unsupported_or_piled_up_encodings_are_refused(
    serve: Callable[[Handler], RawServer], encoding: str
) -> None:
    server = serve(_static(b"\x00" * 100, encoding))
    assert _error(server.url(), _ctx()).reason == "encoding"


def test_corrupt_gzip_is_a_fetch_error(serve: Callable[[Handler], RawServer]) -> None:
    server = serve(_static(b"\x1f\x8b\x08\x00garbage-garbage", "gzip"))
    assert _error(server.url(), _ctx()).reason == "encoding"


@pytest.mark.parametrize(
    "literal", ["[64:ff9b::7f00:1]", "[64:ff9b::a9fe:a9fe]", "[2002:7f00:1::]", "[::7f00:1]"]
)
def test_loopback_inside_ipv6_is_refused_before_connecting(literal: str) -> None:
    error = _error(f"http://{literal}/latest/meta-data/", ProcessContext())
    assert error.reason == "private-network"
    assert "inside" in str(error)


def test_a_lookup_that_never_answers_stops_at_the_deadline() -> None:
    from lamina.processors._web import _resolve

    answered = threading.Event()

    def stuck(host: str, port: int) -> list[tuple[object, ...]]:
        answered.wait(30)  # a resolver that does not answer (released when the test ends)
        return []

    try:
        with pytest.raises(FetchError) as caught:
            _resolve("http://slow.example/", "slow.example", 80, False, 0.2, lookup=stuck)
    finally:
        answered.set()
    assert caught.value.reason == "timeout"
    assert "resolving slow.example took longer than 0.2 s" in str(caught.value)


def test_a_lookup_that_answers_in_time_gives_its_addresses() -> None:
    from lamina.processors._web import _resolve

    def loopback(host: str, port: int) -> list[tuple[object, ...]]:
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port))]

    found = _resolve("http://here.test/", "here.test", 80, True, 5.0, lookup=loopback)
    assert found == ["127.0.0.1"]
    with pytest.raises(FetchError) as refused:
        _resolve("http://here.test/", "here.test", 80, False, 5.0, lookup=loopback)
    assert refused.value.reason == "private-network"
