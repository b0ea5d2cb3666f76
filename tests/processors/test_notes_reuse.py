"""A re-attached note is read and processed again only when something it depends on moved."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from lamina.processors import Sources
from lamina.processors._context import NoteOptions, ProcessContext
from lamina.processors._notes import NoteProcessor, note
from lamina.processors._vault import Vault


def _age(*paths: Path) -> None:
    """Date files and folders an hour back, as in a vault nobody edited lately."""
    for path in paths:
        hour_ago = os.stat(path).st_mtime - 3600
        os.utime(path, (hour_ago, hour_ago))


def _reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Notes read from now on (Vault.read_text calls)."""
    seen: list[str] = []
    real = Vault.read_text

    def read_text(self: Vault, rel: str) -> tuple[str, str | None]:
        seen.append(rel)
        return real(self, rel)

    monkeypatch.setattr(Vault, "read_text", read_text)
    return seen


def _settled_vault(root: Path, files: dict[str, str]) -> Sources:
    for rel, text in files.items():
        (root / rel).write_text(text, encoding="utf-8")
    _age(*(root / rel for rel in files), root)
    return Sources.for_vault(root)


def test_a_settled_unchanged_note_is_not_read_or_processed_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sources = _settled_vault(tmp_path, {"a.md": "# A\nSee [[b]].\n", "b.md": "b"})
    reads = _reads(monkeypatch)
    first = sources.for_turn().process(note("a"))
    again = sources.for_turn().process(note("a"))  # the next turn
    assert reads == ["a.md"]
    assert again is first
    assert [k.target for k in again.links] == ["note:b.md"]


def test_a_note_rewritten_with_its_size_and_mtime_kept_is_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The change time, which no one can set back, tells the rewrite apart."""
    sources = _settled_vault(tmp_path, {"a.md": "one"})
    before = sources.for_turn().process(note("a")).artifacts[0]
    reads = _reads(monkeypatch)
    st = os.stat(tmp_path / "a.md")
    time.sleep(0.05)  # past the file system's timestamp tick
    (tmp_path / "a.md").write_text("two", encoding="utf-8")
    os.utime(tmp_path / "a.md", ns=(st.st_atime_ns, st.st_mtime_ns))
    after = sources.for_turn().process(note("a")).artifacts[0]
    assert reads == ["a.md"]
    assert after.payload.body() == "two"
    assert after.content_hash != before.content_hash


def test_a_note_modified_within_the_racy_window_is_read_every_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A second write within the same timestamp tick would leave its stamp unchanged."""
    (tmp_path / "a.md").write_text("fresh", encoding="utf-8")
    sources = Sources.for_vault(tmp_path)
    reads = _reads(monkeypatch)
    first = sources.for_turn().process(note("a"))
    again = sources.for_turn().process(note("a"))
    assert reads == ["a.md", "a.md"]
    assert again is first  # the same text: processed once all the same


def test_refresh_reads_a_settled_note_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "a.md").write_text("a", encoding="utf-8")
    _age(tmp_path / "a.md", tmp_path)
    sources = Sources.for_vault(tmp_path, refresh=True)
    reads = _reads(monkeypatch)
    sources.for_turn().process(note("a"))
    sources.for_turn().process(note("a"))
    assert reads == ["a.md", "a.md"]


def test_an_unchanged_note_resolves_its_links_against_the_new_listing(tmp_path: Path) -> None:
    sources = _settled_vault(tmp_path, {"a.md": "See [[b]]."})
    before = sources.for_turn().process(note("a"))
    (tmp_path / "b.md").write_text("b", encoding="utf-8")
    after = sources.for_turn().process(note("a"))
    assert [k.target for k in before.links] == ["unresolved:b"]
    assert [k.target for k in after.links] == ["note:b.md"]


def test_an_unchanged_note_inlines_the_embedded_note_as_it_is_now(tmp_path: Path) -> None:
    sources = _settled_vault(tmp_path, {"a.md": "![[b]]", "b.md": "old"})
    before = sources.for_turn().process(note("a"))
    (tmp_path / "b.md").write_text("new", encoding="utf-8")
    after = sources.for_turn().process(note("a"))
    assert [e.payload.body() for e in before.embedded] == ["old"]
    assert [e.payload.body() for e in after.embedded] == ["new"]


def test_a_changed_overlay_note_is_processed_from_its_new_text(tmp_path: Path) -> None:
    sources = _settled_vault(tmp_path, {"a.md": "disk"})
    one = sources.with_changes({"a.md": "one"}).for_turn().process(note("a"))
    two = sources.with_changes({"a.md": "two"}).for_turn().process(note("a"))
    disk = sources.for_turn().process(note("a"))
    assert [p.artifacts[0].payload.body() for p in (one, two, disk)] == ["one", "two", "disk"]


def test_each_properties_setting_shows_its_own_properties(tmp_path: Path) -> None:
    """Two settings sharing one cache (copies of one context) do not see each other's."""
    _settled_vault(tmp_path, {"a.md": "---\nk: v\npublish: true\n---\nbody"})
    cache: dict[str, object] = {}
    shown = [
        NoteProcessor()
        .process(note("a"), ProcessContext(vault=Vault(tmp_path), cache=cache, notes=options))
        .artifacts[0]
        .payload.properties
        for options in (NoteOptions(), NoteOptions(properties="none"), NoteOptions())
    ]
    assert shown == [(("k", "v"),), (), (("k", "v"),)]
