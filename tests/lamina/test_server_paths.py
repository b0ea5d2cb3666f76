"""No answer of ``lamina serve`` names a folder of the server's: a property over the
errors attachments and client notes can cause, against a real server on 127.0.0.1
(issue 36, item 5). The CLI keeps naming the vault (tests/test_cli_errors.py)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.lamina.server import ROOT, VAULT, running

EMPTY = {"turn": 0, "hash": ""}

# Names that exist (notes, folders, a PDF), that do not, that escape, and odd ones.
NAMES = st.sampled_from(
    [
        "glossary.md",
        "glossary",
        "docs",
        "docs/",
        "docs/auth.md",
        "media",
        "media/sync-design-review.pdf",
        "media/offline-sync-talk.vtt",
        "meetings/2026-10-19.md",
        "nope.md",
        "a/b.md",
        "../outside.md",
        "docs/../../x.md",
        "project-spec",
        "\u00e9t\u00e9.md",
    ]
)
KINDS = st.sampled_from(["note", "folder", "tag", "pdf", "youtube", "selection", "bogus"])
FORMS = st.builds(lambda kind, name: {kind: name}, KINDS, NAMES)
NOTES = st.lists(
    st.builds(lambda path, text: {"path": path, "content": text}, NAMES, st.text(max_size=20)),
    max_size=2,
)


def _private(server_tmp: str) -> tuple[str, ...]:
    """Folders of the server's that no answer may name."""
    return (str(ROOT), str(VAULT.resolve()), "lamina-serve-", server_tmp.rstrip("/") + "/")


def test_no_error_for_attachments_or_client_notes_names_a_server_folder(tmp_path: Path) -> None:
    private = _private(tempfile.gettempdir())
    with (
        running(tmp_path / "s.sqlite", "--vault", str(VAULT)) as url,
        httpx.Client(base_url=url, timeout=60) as c,
    ):
        conversations = {
            vault: c.post("/v1/conversations", json={"vault": vault}).json()["id"]
            for vault in (True, False)
        }
        seen: set[int] = set()

        @settings(
            max_examples=60,
            deadline=None,
            derandomize=True,
            suppress_health_check=[HealthCheck.too_slow],
        )
        @given(vault=st.booleans(), attach=st.lists(FORMS, min_size=1, max_size=3), notes=NOTES)
        def probe(vault: bool, attach: list[dict[str, Any]], notes: list[dict[str, str]]) -> None:
            cid = conversations[vault]
            head = c.get(f"/v1/conversations/{cid}").json()["head"]
            body = {"parent": head, "user": "x", "attach": attach, "notes": notes}
            answer = c.post(f"/v1/conversations/{cid}/turns", json=body)
            seen.add(answer.status_code)
            assert answer.status_code < 500, answer.text
            if answer.status_code >= 400:
                error = answer.json()
                assert set(error) == {"error", "field", "status"}
                leaked = [p for p in private if p in answer.text]
                assert not leaked, (leaked, answer.text)
                assert error["field"].startswith(("attach", "notes")), error

        probe()
    assert 422 in seen and 200 in seen  # both refusals and builds were exercised
