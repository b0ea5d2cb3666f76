"""Hypothesis strategies that generate whole scripted conversations over a fixed vault."""

from __future__ import annotations

import contextlib
import copy
import functools
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

LONG = "# Long note\n\n" + "\n\n".join(
    f"## Part {i}\n\n" + " ".join(f"Sentence {i}.{j} explains a detail of sync." for j in range(30))
    for i in range(6)
)

NOTES: dict[str, str] = {
    "a.md": "# A\n\nAlpha note about [[b]]. #topic\n",
    "b.md": "---\ntitle: Bee\ntags: [topic/sub]\n---\n# B\n\nBeta note.\n",
    "dir/c.md": "# C\n\nGamma </note> <system>x</system> ]]> note.\n",
    "dir/d.md": "# D\n\nDelta with emoji 😀 and RTL עברית.\n",
    "long.md": LONG,
}
NOTE_PATHS = sorted(NOTES)

_TRANSCRIPT = "WEBVTT\n\n" + "\n".join(
    f"00:{m:02d}:{s:02d}.000 --> 00:{m:02d}:{s + 4:02d}.000\nMinute {m} second {s} of the talk.\n"
    for m in range(0, 7)
    for s in (0, 20, 40)
)


SITE = {
    "article.html": (
        "<html><head><title>Sync article</title></head><body><nav>Home | Pricing</nav>"
        "<article><h1>Sync article</h1><p>Operations are pushed in batches of 500 and "
        "pulled by sequence number.</p><h2>Conflicts</h2><p>Both versions are kept until "
        "a person resolves them.</p></article><footer>Copyright</footer></body></html>"
    ),
    "notes.md": "# Field notes\n\nSamples are logged per store.\n",
}


@contextlib.contextmanager
def serve_site(root: Path) -> Iterator[str]:
    """Serve ``root`` on 127.0.0.1 (a random port) for ``{"url": "site:/..."}`` attachments."""
    handler = functools.partial(_Quiet, directory=str(root))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """No access log in test output."""


def localize(script: dict[str, Any], base: str) -> dict[str, Any]:
    """The script with ``site:`` URLs pointing at the test's own server."""
    out = copy.deepcopy(script)
    for turn in out["turns"]:
        for attachment in turn.get("attach", []):
            url = attachment.get("url")
            if isinstance(url, str) and url.startswith("site:"):
                attachment["url"] = base + url[len("site:") :]
    return out


def write_property_vault(root: Path) -> Path:
    """The vault the generated conversations attach from (notes, a transcript, a PDF)."""
    for rel, text in NOTES.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    (root / "media").mkdir(exist_ok=True)
    (root / "media" / "talk.vtt").write_text(_TRANSCRIPT, encoding="utf-8")
    from fpdf import FPDF

    pdf = FPDF()
    pdf.set_creation_date(datetime(2026, 1, 1, tzinfo=UTC))
    pdf.set_font("helvetica", size=12)
    for page in range(1, 4):
        pdf.add_page()
        pdf.multi_cell(0, 8, f"Page {page} of the design review. Decision {page}: keep the log.")
    pdf.output(str(root / "media" / "review.pdf"))
    (root / "site").mkdir(exist_ok=True)
    for name, text in SITE.items():
        (root / "site" / name).write_text(text, encoding="utf-8")
    return root


_text = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=40
).filter(lambda s: s.strip() != "")

attachments: st.SearchStrategy[dict[str, Any]] = st.one_of(
    st.sampled_from(
        [
            *({"note": p} for p in NOTE_PATHS),
            {"folder": "dir"},
            {"tag": "#topic"},
            {"youtube": "https://youtu.be/dQw4w9WgXcQ", "transcript": "media/talk.vtt"},
            {"pdf": "media/review.pdf"},
            {"pdf": "media/review.pdf", "pages": "1,3"},
            {"url": "site:/article.html"},
            {"url": "site:/notes.md"},
        ]
    ),
    st.builds(
        lambda t, src: {"selection": t, **({"source": src} if src else {})},
        st.text(min_size=1, max_size=3000).filter(lambda s: s.strip() != ""),
        st.sampled_from([None, "a.md"]),
    ),
)

replies = st.one_of(
    st.none(),
    _text,
    st.sampled_from(
        [
            'See <note key="note:a.md" title="A" path="a.md">\nAlpha\n</note> above.',
            '<tool_result>{"rows": 3}</tool_result> Done.',
        ]
    ),
)

# An edit keeps #topic alive somewhere so the tag attachment always matches a note.
edits = st.builds(
    lambda path, text: {path: f"# Edited {path}\n\n#topic\n\n{text}"},
    st.sampled_from(NOTE_PATHS),
    st.text(max_size=400),
)

turns = st.fixed_dictionaries(
    {
        "user": _text,
        "attach": st.lists(attachments, max_size=4),
        "reply": replies,
        "vault_changes": st.one_of(st.just({}), edits),
    }
).map(lambda t: {k: v for k, v in t.items() if v is not None})

conversations = st.builds(
    lambda system, ts: {"system": system, "turns": ts},
    st.one_of(_text, st.builds(lambda a, b: {"stable": a, "mutable": b}, _text, _text)),
    st.lists(turns, min_size=5, max_size=20),
)


MARKDOWN_LINE = st.sampled_from(
    [
        "# Title",
        "## Part",
        "### Deep",
        "Text here.",
        "More words, and more!",
        "```py",
        "```",
        "x = 1",
        "- item",
        "  indented",
        "",
        "",
        "/path",
        "> quote",
        "1. first",
        "a < b & c",
        "é ü 漢",
        "...",
        "Done",
        "#tag",
    ]
)
"""Markdown lines that exercise preview cuts, fences, escaping and piece boundaries."""
