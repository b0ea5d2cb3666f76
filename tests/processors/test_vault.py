"""Vault paths, reading, listing and the in-memory overlay."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from lamina.pipeline._errors import ConfigError, NoteNotFound, PathOutsideVault
from lamina.processors._vault import Vault


def make_vault(root: Path, files: dict[str, str | bytes]) -> Vault:
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")
    return Vault(root)


def test_resolve_normalizes_to_slash_relative_paths(tmp_path: Path) -> None:
    vault = make_vault(tmp_path, {"docs/a.md": "a"})
    assert vault.resolve("./docs/../docs/a.md") == "docs/a.md"
    assert vault.resolve("docs\\a.md") == "docs/a.md"


@pytest.mark.parametrize("bad", ["../secret.md", "docs/../../secret.md", ".."])
def test_resolve_refuses_dotdot_escapes(tmp_path: Path, bad: str) -> None:
    vault = make_vault(tmp_path / "v", {"docs/a.md": "a"})
    with pytest.raises(PathOutsideVault) as info:
        vault.resolve(bad)
    assert info.value.path == bad
    assert bad in str(info.value)


@pytest.mark.parametrize("bad", ["/etc/passwd", "C:/Windows/win.ini"])
def test_resolve_refuses_absolute_paths(tmp_path: Path, bad: str) -> None:
    vault = make_vault(tmp_path, {"a.md": "a"})
    with pytest.raises(PathOutsideVault, match="absolute"):
        vault.resolve(bad)


def test_symlink_out_of_the_vault_is_refused_and_not_listed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.md").write_text("top secret", encoding="utf-8")
    vault = make_vault(tmp_path / "v", {"a.md": "a"})
    os.symlink(outside / "secret.md", tmp_path / "v" / "leak.md")
    os.symlink(outside, tmp_path / "v" / "linked")
    with pytest.raises(PathOutsideVault, match="symlink"):
        vault.read_text("leak.md")
    with pytest.raises(PathOutsideVault):
        vault.read_text("linked/secret.md")
    assert vault.notes() == ("a.md",)


def test_symlink_inside_the_vault_is_allowed(tmp_path: Path) -> None:
    vault = make_vault(tmp_path, {"real.md": "real text"})
    os.symlink(tmp_path / "real.md", tmp_path / "alias.md")
    assert vault.read_text("alias.md") == ("real text", None)


def test_missing_root_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not a directory"):
        Vault(tmp_path / "nope")


def test_notes_are_sorted_and_skip_hidden_folders(tmp_path: Path) -> None:
    vault = make_vault(
        tmp_path,
        {
            "b.md": "",
            "a/z.md": "",
            "a/b/c.md": "",
            ".obsidian/workspace.md": "",
            ".git/x.md": "",
            ".trash/old.md": "",
            "image.png": "",
        },
    )
    assert vault.notes() == ("a/b/c.md", "a/z.md", "b.md")


def test_note_path_accepts_a_path_without_md(tmp_path: Path) -> None:
    vault = make_vault(tmp_path, {"docs/api.md": "x"})
    assert vault.note_path("docs/api") == "docs/api.md"


def test_missing_note_names_it_and_suggests_close_matches(tmp_path: Path) -> None:
    vault = make_vault(tmp_path, {"docs/api-docs.md": "", "project-spec.md": ""})
    with pytest.raises(NoteNotFound) as info:
        vault.note_path("api-doc.md")
    assert info.value.path == "api-doc.md"
    assert "docs/api-docs.md" in info.value.suggestions
    assert "api-doc.md" in str(info.value)
    assert vault.suggest("project-spek") == ("project-spec.md",)


def test_utf8_bom_is_stripped_and_crlf_normalized(tmp_path: Path) -> None:
    vault = make_vault(tmp_path, {"a.md": b"\xef\xbb\xbf# T\r\nline\r\n"})
    assert vault.read_text("a.md") == ("# T\nline\n", None)


def test_non_utf8_bytes_are_replaced_with_a_warning(tmp_path: Path) -> None:
    vault = make_vault(tmp_path, {"latin.md": b"caf\xe9 ok"})
    text, warning = vault.read_text("latin.md")
    assert text == "caf\ufffd ok"
    assert warning is not None
    assert "latin.md" in warning
    assert "offset 3" in warning


def test_overlay_changes_text_and_adds_notes_without_writing_disk(tmp_path: Path) -> None:
    vault = make_vault(tmp_path, {"a.md": "disk"})
    changed = vault.with_changes({"a.md": "memory", "new/b": "added"})
    assert changed.read_text("a.md") == ("memory", None)
    assert changed.notes() == ("a.md", "new/b.md")
    assert vault.read_text("a.md") == ("disk", None)
    assert (tmp_path / "a.md").read_text(encoding="utf-8") == "disk"
    assert not (tmp_path / "new").exists()


def test_overlay_refuses_paths_outside_the_vault(tmp_path: Path) -> None:
    vault = make_vault(tmp_path, {"a.md": "x"})
    with pytest.raises(PathOutsideVault):
        vault.with_changes({"../evil.md": "x"})


def test_vaults_compare_by_root_and_overlay(tmp_path: Path) -> None:
    vault = make_vault(tmp_path, {"a.md": "x"})
    assert Vault(tmp_path) == vault
    assert vault.with_changes({"a.md": "y"}) == vault.with_changes({"a.md": "y"})
    assert vault.with_changes({"a.md": "y"}) != vault


def _walks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Folders listed from now on (os.scandir calls)."""
    seen: list[str] = []
    real = os.scandir

    def scandir(path: str) -> object:
        seen.append(str(path))
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)
    return seen


def _age(*folders: Path) -> None:
    hour_ago = os.stat(folders[0]).st_mtime - 3600
    for folder in folders:
        os.utime(folder, (hour_ago, hour_ago))


def test_a_listing_is_reused_across_turns_until_a_folder_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.md").write_text("a", encoding="utf-8")
    (tmp_path / "sub" / "b.md").write_text("b", encoding="utf-8")
    _age(tmp_path, tmp_path / "sub")
    vault, shared = Vault(tmp_path), {}
    walks = _walks(monkeypatch)
    assert vault.snapshot(shared).notes() == ("a.md", "sub/b.md")
    assert len(walks) == 2
    listed = vault.snapshot(shared).notes()  # the next turn
    assert listed == ("a.md", "sub/b.md")
    assert len(walks) == 2
    assert vault.snapshot(shared).notes() is listed  # one tuple, not sorted again
    (tmp_path / "sub" / "c.md").write_text("c", encoding="utf-8")  # sub's mtime moves
    assert vault.snapshot(shared).notes() == ("a.md", "sub/b.md", "sub/c.md")
    assert len(walks) == 4


def test_a_folder_changed_just_before_a_walk_is_walked_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Within a timestamp tick a second change would not move the mtime: not trusted."""
    (tmp_path / "a.md").write_text("a", encoding="utf-8")
    vault, shared = Vault(tmp_path), {}
    walks = _walks(monkeypatch)
    vault.snapshot(shared).notes()
    vault.snapshot(shared).notes()
    assert len(walks) == 2


def test_one_turn_lists_the_vault_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "a.md").write_text("a", encoding="utf-8")
    snapshot = Vault(tmp_path).snapshot()
    walks = _walks(monkeypatch)
    snapshot.notes()
    (tmp_path / "b.md").write_text("b", encoding="utf-8")
    assert snapshot.notes() == ("a.md",)  # the turn's one consistent listing
    assert len(walks) == 1
    assert Vault(tmp_path).notes() == ("a.md", "b.md")


def test_a_path_is_resolved_once_per_conversation_and_read_confined_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The realpath check is for early errors; a note swapped for a symlink out of the
    vault after its first turn is still refused when read."""
    outside = tmp_path / "outside.md"
    outside.write_text("top secret", encoding="utf-8")
    vault, shared = make_vault(tmp_path / "v", {"a.md": "a"}), {}
    checks: list[str] = []
    real = os.path.realpath
    monkeypatch.setattr(os.path, "realpath", lambda p: checks.append(p) or real(p))
    assert vault.snapshot(shared).read_text("a.md") == ("a", None)
    assert vault.snapshot(shared).read_text("a.md") == ("a", None)  # the next turn
    assert len(checks) == 1
    os.remove(tmp_path / "v" / "a.md")
    os.symlink(outside, tmp_path / "v" / "a.md")
    with pytest.raises(PathOutsideVault):
        vault.snapshot(shared).read_text("a.md")


def test_a_snapshot_is_the_same_vault_with_its_own_listing(tmp_path: Path) -> None:
    vault = Vault(tmp_path, {"o.md": "overlay"})
    (tmp_path / "a.md").write_text("a", encoding="utf-8")
    one, two = vault.snapshot(), vault.snapshot()
    assert one == vault and one.root == vault.root and one.overlay == vault.overlay
    assert one.notes() == ("a.md", "o.md")
    (tmp_path / "b.md").write_text("b", encoding="utf-8")
    assert one.notes() == ("a.md", "o.md")
    assert two.notes() == ("a.md", "b.md", "o.md")
