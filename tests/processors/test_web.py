"""url(u): fetched from a real HTTP server on 127.0.0.1 started by these tests."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from lamina.pipeline.errors import AttachmentError, FetchError
from lamina.pipeline.sources import TurnWarning
from lamina.processors import (
    ProcessContext,
    Registry,
    UrlPayload,
    UrlProcessor,
    normalize_url,
    url,
)
from lamina.processors._web import UrlSpec

PAGES = Path(__file__).parent / "pages"

Route = Callable[[BaseHTTPRequestHandler], None]


def _send(
    handler: BaseHTTPRequestHandler,
    body: bytes,
    content_type: str = "text/html; charset=utf-8",
    status: int = 200,
    headers: dict[str, str] | None = None,
    length: bool = True,
) -> None:
    handler.send_response(status)
    handler.send_header("Content-Type", content_type)
    if length:
        handler.send_header("Content-Length", str(len(body)))
    for name, value in (headers or {}).items():
        handler.send_header(name, value)
    handler.end_headers()
    handler.wfile.write(body)


def _redirect(target: str, status: int = 302) -> Route:
    return lambda h: _send(h, b"", "text/plain", status, {"Location": target})


class Server:
    """A ThreadingHTTPServer on a random 127.0.0.1 port that counts hits per path."""

    def __init__(self) -> None:
        self.hits: Counter[str] = Counter()
        self.hosts: list[str] = []
        self.release = threading.Event()
        self.routes: dict[str, Route] = self._routes()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?")[0]
                server.hits[path] += 1
                server.hosts.append(self.headers.get("Host", ""))
                route = server.routes.get(path)
                if route is None:
                    _send(self, b"<h1>Not found</h1>", status=404)
                else:
                    route(self)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def _routes(self) -> dict[str, Route]:
        article = (PAGES / "article.html").read_bytes()
        blog = (PAGES / "blog.html").read_bytes()
        cafe = (
            "<html><head><title>Caf\u00e9 menu</title></head><body><article><h1>Caf\u00e9 menu</h1>"
        )
        cafe += "<p>\u201cCr\u00e8me br\u00fbl\u00e9e\u201d \u2013 our na\u00efve favourite, "
        cafe += "served every day with a smile and a spoon.</p>" * 3 + "</article></body></html>"

        def slow(h: BaseHTTPRequestHandler) -> None:
            self.release.wait(5)
            _send(h, b"<p>late</p>")

        return {
            "/article": lambda h: _send(h, article),
            "/blog": lambda h: _send(h, blog),
            "/r1": _redirect("/r2", 301),
            "/r2": _redirect("/article", 307),
            "/loop-a": _redirect("/loop-b"),
            "/loop-b": _redirect("/loop-a"),
            "/to-ftp": _redirect("ftp://127.0.0.1/file"),
            "/to-private": _redirect(f"http://127.0.0.2:{0}/article"),
            "/server-error": lambda h: _send(h, b"boom", status=500),
            "/slow": slow,
            "/big": lambda h: _send(h, b"<p>" + b"x" * 5000 + b"</p>"),
            "/big-stream": lambda h: _send(h, b"<p>" + b"x" * 5000 + b"</p>", length=False),
            "/cp1252": lambda h: _send(h, cafe.encode("cp1252"), "text/html; charset=windows-1252"),
            "/latin1": lambda h: _send(h, cafe.encode("cp1252"), "text/html; charset=ISO-8859-1"),
            "/undeclared": lambda h: _send(h, cafe.encode("cp1252"), "text/html"),
            "/meta-charset": lambda h: _send(
                h,
                b'<meta charset="windows-1252">' + cafe.encode("cp1252"),
                "text/html",
            ),
            "/specials": lambda h: _send(h, _SPECIALS.encode()),
            "/empty": lambda h: _send(h, b"<html><body><script>x()</script></body></html>"),
            "/image.png": lambda h: _send(h, b"\x89PNG\r\n\x1a\n" + bytes(64), "image/png"),
            "/notes.md": lambda h: _send(
                h,
                b"Intro line.\r\n\r\n# Release notes\r\n\r\n## 1.2\r\n\r\n- faster\r\n",
                "text/markdown; charset=utf-8",
            ),
            "/files/readme.txt": lambda h: _send(h, b"Just some text.\n", "text/plain"),
        }


_SPECIALS = """<html><head><title>Specials</title></head><body><article><h1>Specials</h1>
<p>Footnote [1] and snake_case_name and 2*3*4 and a &lt;tag&gt; and ~x~ and C:\\dir\\*.md.</p>
<p># not a heading, and <b>bold text</b> here. See <code>a_b [x] \\* y</code> too.</p>
<p>1. not a list, really; the sentence is long enough for extraction to keep it.</p>
<p>- a dash starts this sentence, which is long enough for the extractor to keep.</p>
<p>Some more paragraph text so that trafilatura treats this as the page's main content.</p>
</article></body></html>"""


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    srv = Server()
    srv.routes["/to-private"] = _redirect(f"http://127.0.0.2:{srv.port}/article")
    srv.thread.start()
    yield srv
    srv.release.set()
    srv.httpd.shutdown()
    srv.httpd.server_close()


@pytest.fixture
def ctx() -> ProcessContext:
    return ProcessContext(allow_private_network=True)


def fetch(u: str, ctx: ProcessContext, **spec: Any) -> UrlPayload:
    processed = UrlProcessor().process(url(u, **spec), ctx)
    (artifact,) = processed.artifacts
    assert isinstance(artifact.payload, UrlPayload)
    return artifact.payload


def fetch_error(u: str, ctx: ProcessContext) -> FetchError:
    with pytest.raises(FetchError) as info:
        UrlProcessor().process(url(u), ctx)
    return info.value


# --- extraction -------------------------------------------------------------------------------


def test_article_becomes_one_recoverable_url_artifact(server: Server, ctx: ProcessContext) -> None:
    processed = UrlProcessor().process(url(server.url("/article")), ctx)
    (artifact,) = processed.artifacts
    assert artifact.key == f"url:http://127.0.0.1:{server.port}/article"
    assert artifact.source_type == "url"
    assert artifact.recoverable
    assert artifact.payload.attributes() == (("url", server.url("/article")),)
    assert artifact.locator == server.url("/article")


def test_the_page_text_reaches_the_model_as_written_not_markdown_escaped(
    server: Server, ctx: ProcessContext
) -> None:
    text = fetch(server.url("/specials"), ctx).text
    assert text == (
        "# Specials\n\n"
        "Footnote [1] and snake_case_name and 2*3*4 and a <tag> and ~x~ and C:\\dir\\*.md.\n\n"
        "# not a heading, and **bold text** here. See `a_b [x] \\* y` too.\n\n"
        "1. not a list, really; the sentence is long enough for extraction to keep it.\n\n"
        "- a dash starts this sentence, which is long enough for the extractor to keep.\n\n"
        "Some more paragraph text so that trafilatura treats this as the page's main content."
    )


def test_article_title_and_main_text_are_extracted(server: Server, ctx: ProcessContext) -> None:
    page = fetch(server.url("/article"), ctx)
    assert page.title == "Why Prefix Caches Reward Stable Prompts"
    assert "longest common prefix of the requests" in page.text
    assert "- System instructions that never change belong at the very start." in page.text
    assert "def build_request(system, library, history, query):" in page.text
    assert "| Context in system message | 78% | 1.1 s |" in page.text


def test_article_boilerplate_is_removed(server: Server, ctx: ProcessContext) -> None:
    text = fetch(server.url("/article"), ctx).text
    for junk in ("cookies", "Subscribe", "crypto", "Ten tips", "CloudHost", "Privacy policy"):
        assert junk not in text


def test_article_headings_stay_markdown_headings(server: Server, ctx: ProcessContext) -> None:
    lines = fetch(server.url("/article"), ctx).text.splitlines()
    assert "## How the cache decides what matches" in lines
    assert "### A worked example" in lines
    assert "## What to take away" in lines


def test_heading_after_code_block_is_not_indented(server: Server, ctx: ProcessContext) -> None:
    """trafilatura leaves source indentation after <pre>; it must not hide the next heading."""
    text = fetch(server.url("/blog"), ctx).text
    assert "\n## Pitfalls\n" in text
    assert "```\nlog = log.bind(request_id=rid)\n" in text
    assert "Archive" not in text


def test_plain_markdown_passes_through_with_first_heading_as_title(
    server: Server, ctx: ProcessContext
) -> None:
    page = fetch(server.url("/notes.md"), ctx)
    assert page.title == "Release notes"
    assert page.text == "Intro line.\n\n# Release notes\n\n## 1.2\n\n- faster"


def test_plain_text_title_is_last_path_segment(server: Server, ctx: ProcessContext) -> None:
    page = fetch(server.url("/files/readme.txt"), ctx)
    assert (page.title, page.text) == ("readme.txt", "Just some text.")


@pytest.mark.parametrize("path", ["/cp1252", "/latin1", "/meta-charset", "/undeclared"])
def test_non_utf8_page_is_decoded(server: Server, ctx: ProcessContext, path: str) -> None:
    """Charset from the header (ISO-8859-1 read as windows-1252, as browsers do), a meta tag,
    or detection when nothing is declared."""
    page = fetch(server.url(path), ctx)
    assert page.title == "Caf\u00e9 menu"
    assert "\u201cCr\u00e8me br\u00fbl\u00e9e\u201d \u2013 our na\u00efve favourite" in page.text


def test_page_without_text_gives_a_warning_not_an_error(
    server: Server, ctx: ProcessContext
) -> None:
    processed = UrlProcessor().process(url(server.url("/empty")), ctx)
    assert processed.artifacts[0].payload.body() == ""
    empty = TurnWarning(
        "page-no-text", f"url:{server.url('/empty')}", "no readable text found on the page"
    )
    assert processed.warnings == (empty,)


def test_host_name_is_sent_while_connecting_to_the_checked_address(
    server: Server, ctx: ProcessContext
) -> None:
    page = fetch(f"http://LocalHost:{server.port}/blog", ctx)
    assert page.url == f"http://localhost:{server.port}/blog"
    assert server.hosts[-1] == f"localhost:{server.port}"


def test_same_page_gives_same_content_hash(server: Server, ctx: ProcessContext) -> None:
    first = UrlProcessor().process(url(server.url("/article")), ctx).artifacts[0]
    again = UrlProcessor().process(url(server.url("/article"), refresh=True), ctx).artifacts[0]
    assert first.content_hash == again.content_hash


def test_replace_text_maps_title_and_text_not_url() -> None:
    page = UrlPayload("https://a.example/", "secret title", "a secret")
    mapped = page.replace_text(lambda s: s.replace("secret", "***"))
    assert mapped == UrlPayload("https://a.example/", "*** title", "a ***")


# --- redirects --------------------------------------------------------------------------------


def test_redirects_are_followed_and_final_url_kept(server: Server, ctx: ProcessContext) -> None:
    processed = UrlProcessor().process(url(server.url("/r1")), ctx)
    (artifact,) = processed.artifacts
    assert artifact.key == f"url:{server.url('/r1')}"
    assert isinstance(artifact.payload, UrlPayload)
    assert artifact.payload.final_url == server.url("/article")
    assert artifact.payload.title == "Why Prefix Caches Reward Stable Prompts"


def test_redirect_loop_is_refused(server: Server, ctx: ProcessContext) -> None:
    error = fetch_error(server.url("/loop-a"), ctx)
    assert error.reason == "redirects"
    assert "loop" in str(error)


def test_too_many_redirects_are_refused(server: Server) -> None:
    ctx = ProcessContext(allow_private_network=True, options={"url_max_redirects": 1})
    error = fetch_error(server.url("/r1"), ctx)
    assert error.reason == "redirects"
    assert "more than 1 redirects" in str(error)


def test_redirect_to_other_scheme_is_refused(server: Server, ctx: ProcessContext) -> None:
    error = fetch_error(server.url("/to-ftp"), ctx)
    assert (error.reason, error.url) == ("redirects", server.url("/to-ftp"))
    assert "ftp" in str(error)


def test_redirect_target_is_rechecked_for_private_network(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Treat only 127.0.0.1 as public: the first hop passes, the hop to 127.0.0.2 is refused."""
    import lamina.processors._web as web

    real = web._is_public
    monkeypatch.setattr(web, "_is_public", lambda ip: str(ip) == "127.0.0.1" or real(ip))
    before = server.hits["/article"]
    error = fetch_error(server.url("/to-private"), ProcessContext())
    assert error.reason == "private-network"
    assert "127.0.0.2" in str(error)
    assert server.hits["/article"] == before


# --- failures ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("path", "status"), [("/missing", 404), ("/server-error", 500)])
def test_http_error_status_is_reported(
    server: Server, ctx: ProcessContext, path: str, status: int
) -> None:
    error = fetch_error(server.url(path), ctx)
    assert error.reason == "http-status"
    assert f"HTTP {status}" in str(error)


def test_slow_server_times_out_quickly(server: Server) -> None:
    ctx = ProcessContext(allow_private_network=True, options={"url_timeout": 0.2})
    started = time.monotonic()
    error = fetch_error(server.url("/slow"), ctx)
    assert error.reason == "timeout"
    assert time.monotonic() - started < 2


@pytest.mark.parametrize("path", ["/big", "/big-stream"])
def test_page_over_byte_cap_is_refused(server: Server, path: str) -> None:
    """Refused from Content-Length, and while streaming when there is none."""
    ctx = ProcessContext(allow_private_network=True, options={"url_max_bytes": 1000})
    error = fetch_error(server.url(path), ctx)
    assert error.reason == "too-large"
    assert "1,000-byte cap" in str(error)


def test_binary_content_type_is_refused(server: Server, ctx: ProcessContext) -> None:
    error = fetch_error(server.url("/image.png"), ctx)
    assert error.reason == "not-text"
    assert "image/png" in str(error)


def test_unresolvable_host_is_a_dns_error(ctx: ProcessContext) -> None:
    error = fetch_error("http://no-such-host.invalid/page", ctx)
    assert error.reason == "dns"


def test_private_address_is_refused_by_default(server: Server) -> None:
    before = server.hits["/article"]
    error = fetch_error(server.url("/article"), ProcessContext())
    assert error.reason == "private-network"
    assert "allow_private_network" in str(error)
    assert server.hits["/article"] == before


@pytest.mark.parametrize(
    "address",
    [
        "10.0.0.1",
        "172.16.5.4",
        "192.168.1.1",
        "169.254.169.254",
        "100.64.0.1",
        "0.0.0.0",
        "224.0.0.1",
        "[::1]",
        "[fe80::1]",
        "[fc00::1]",
        "[::ffff:127.0.0.1]",
    ],
)
def test_non_public_address_literals_are_refused(address: str) -> None:
    error = fetch_error(f"http://{address}/", ProcessContext())
    assert error.reason == "private-network"


def test_bad_option_is_a_config_error(server: Server) -> None:
    from lamina.pipeline.errors import ConfigError

    ctx = ProcessContext(allow_private_network=True, options={"url_timeout": "soon"})
    with pytest.raises(ConfigError, match="url_timeout"):
        UrlProcessor().process(url(server.url("/article")), ctx)


# --- cache ------------------------------------------------------------------------------------


def test_second_fetch_of_same_url_hits_the_cache(server: Server, ctx: ProcessContext) -> None:
    before = server.hits["/blog"]
    first = fetch(server.url("/blog"), ctx)
    again = fetch(f"HTTP://127.0.0.1:{server.port}/blog#comments", ctx)
    assert again == first
    assert server.hits["/blog"] == before + 1


def test_cache_is_per_context(server: Server) -> None:
    before = server.hits["/blog"]
    fetch(server.url("/blog"), ProcessContext(allow_private_network=True))
    fetch(server.url("/blog"), ProcessContext(allow_private_network=True))
    assert server.hits["/blog"] == before + 2


def test_context_refresh_refetches(server: Server) -> None:
    ctx = ProcessContext(allow_private_network=True, refresh=True)
    before = server.hits["/blog"]
    fetch(server.url("/blog"), ctx)
    fetch(server.url("/blog"), ctx)
    assert server.hits["/blog"] == before + 2


def test_spec_refresh_refetches(server: Server, ctx: ProcessContext) -> None:
    before = server.hits["/blog"]
    fetch(server.url("/blog"), ctx)
    fetch(server.url("/blog"), ctx, refresh=True)
    fetch(server.url("/blog"), ctx)
    assert server.hits["/blog"] == before + 2


# --- URLs and specs ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "normalized"),
    [
        ("https://example.com", "https://example.com/"),
        ("HTTPS://Example.COM/Path", "https://example.com/Path"),
        ("http://example.com:80/a", "http://example.com/a"),
        ("https://example.com:443/a", "https://example.com/a"),
        ("http://example.com:443/a", "http://example.com:443/a"),
        ("https://example.com:8443/a", "https://example.com:8443/a"),
        ("https://example.com/a?b=1&a=2", "https://example.com/a?b=1&a=2"),
        ("https://example.com/a#section", "https://example.com/a"),
        ("https://example.com?q=1#x", "https://example.com/?q=1"),
        ("  https://example.com/a  ", "https://example.com/a"),
        ("https://example.com./a", "https://example.com/a"),
        ("http://[2001:DB8::1]:80/", "http://[2001:db8::1]/"),
        ("https://bücher.example/", "https://xn--bcher-kva.example/"),
    ],
)
def test_normalize_url(given: str, normalized: str) -> None:
    assert normalize_url(given) == normalized


@pytest.mark.parametrize(
    ("given", "reason"),
    [
        ("ftp://example.com/file", "scheme"),
        ("file:///etc/passwd", "scheme"),
        ("javascript:alert(1)", "scheme"),
        ("example.com/page", "scheme"),
        ("https:///path-only", "url"),
        ("https://user:pw@example.com/", "url"),
        ("https://example.com:99999/", "url"),
    ],
)
def test_bad_urls_are_refused_when_attached(given: str, reason: str) -> None:
    with pytest.raises(FetchError) as info:
        url(given)
    assert (info.value.reason, info.value.url) == (reason, given)


def test_script_form_parses_through_the_registry() -> None:
    registry = Registry([UrlProcessor()])
    assert registry.parse({"url": "https://example.com/a"}) == UrlSpec("https://example.com/a")
    spec = registry.parse({"url": "https://example.com/a", "refresh": True})
    assert spec == url("https://example.com/a", refresh=True)
    assert spec.kind == "url"
    assert spec.describe() == "url https://example.com/a"


@pytest.mark.parametrize(
    "data",
    [{"url": 3}, {"url": "https://example.com/", "pages": "1"}, {"url": "x", "refresh": "yes"}],
)
def test_bad_script_form_is_an_attachment_error(data: dict[str, Any]) -> None:
    with pytest.raises(AttachmentError):
        UrlProcessor().parse(data)
