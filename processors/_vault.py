"""A vault: a folder of markdown notes addressed by vault-relative ``/`` paths.

Every path goes through ``resolve`` so nothing outside the root is ever read, and an
in-memory overlay lets scripts change notes for a turn without writing to disk.
"""

from __future__ import annotations

import difflib
import os
import posixpath
import re
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import attrs

from lamina.pipeline.errors import AttachmentError, ConfigError, NoteNotFound, PathOutsideVault
from lamina.pipeline.inputs import FileProblem, read_confined

__all__ = ["MAX_NOTE_BYTES", "FileStamp", "Vault"]

MAX_NOTE_BYTES = 16 * 1024 * 1024
"""Notes larger than this are refused rather than read into memory."""

_BOM = "\ufeff"
_DRIVE = re.compile(r"^[A-Za-z]:")


def _root(value: str | os.PathLike[str]) -> Path:
    return Path(os.path.realpath(os.fspath(value)))


def _overlay(value: Mapping[str, str] | None) -> Mapping[str, str]:
    items: dict[str, str] = {}
    for rel, text in (value or {}).items():
        if not isinstance(text, str):
            raise AttachmentError(str(rel), "a vault change must be text")
        norm = _normalize(rel)
        if norm == ".":
            raise PathOutsideVault(str(rel), "a vault change must name a note, not the vault root")
        if "." not in posixpath.basename(norm):
            norm += ".md"
        items[norm] = text
    return MappingProxyType(dict(sorted(items.items())))


def _normalize(rel: Any) -> str:
    """Lexically normalize a vault-relative path; refuse absolute paths and ``..`` escapes."""
    if not isinstance(rel, str):
        raise AttachmentError(repr(rel)[:60], "a vault path must be a string")
    if "\x00" in rel:
        raise AttachmentError(repr(rel)[:60], "a vault path must not contain NUL")
    path = rel.replace("\\", "/").strip()
    if path.startswith("/") or _DRIVE.match(path):
        raise PathOutsideVault(rel, "absolute paths are refused; give a path relative to the vault")
    norm = posixpath.normpath(path) if path else "."
    if norm == ".." or norm.startswith("../"):
        raise PathOutsideVault(rel, "path escapes the vault with '..'")
    return norm


def _hidden(rel: str) -> bool:
    return any(part.startswith(".") for part in rel.split("/") if part != ".")


# A folder changed this close before a walk may change again within the same timestamp
# tick unseen: such a walk is not trusted (git's "racy" rule).
_RACY_NS = 2_000_000_000


@attrs.frozen
class FileStamp:
    """A note file's identity as one ``stat`` saw it (symlinks followed). The same stamp
    later means the same bytes once the file was ``settled`` when it was read: a write
    moves the modification time (and an ``utime`` back moves the change time)."""

    device: int
    inode: int
    size: int
    mtime_ns: int
    ctime_ns: int

    def settled(self, read_ns: int) -> bool:
        """Whether the file was last modified well before ``read_ns`` (the clock when it was
        stamped, before its read): a write within the same timestamp tick as the read could
        otherwise leave the stamp unchanged (git's "racy" rule, as for the vault walk;
        like git, the change time is compared but not required to be old). A write between
        the stamp and the read moves the stamp, so the next turn reads again."""
        return self.mtime_ns < read_ns - _RACY_NS


@attrs.frozen
class _DiskListing:
    """One walk of the vault: its notes (sorted), and each folder walked with its mtime then."""

    notes: tuple[str, ...]
    folders: tuple[tuple[str, int], ...]
    taken_ns: int

    def still_valid(self) -> bool:
        """No walked folder gained, lost or renamed an entry (its mtime would have moved)."""
        for folder, mtime in self.folders:
            try:
                now = os.stat(folder).st_mtime_ns
            except OSError:
                return False
            if now != mtime or now >= self.taken_ns - _RACY_NS:
                return False
        return True


@attrs.frozen
class Vault:
    """Notes under ``root``; ``overlay`` (path -> text) is applied over disk, in memory."""

    root: Path = attrs.field(converter=_root)
    overlay: Mapping[str, str] = attrs.field(default=None, converter=_overlay, hash=False)
    # Set on a snapshot: the listing and resolved paths, made on first use and kept for
    # the turn (see ``snapshot``).
    _listing: dict[str, tuple[str, ...]] | None = attrs.field(
        default=None, eq=False, hash=False, repr=False, alias="listing"
    )
    # Shared across a conversation's turns: the last walk of the disk, re-used while no
    # folder of it has changed (see ``_DiskListing``).
    _shared: dict[str, Any] | None = attrs.field(
        default=None, eq=False, hash=False, repr=False, alias="shared"
    )

    def __attrs_post_init__(self) -> None:
        if not self.root.is_dir():
            raise ConfigError("vault", f"{self.root} is not a directory")

    def resolve(self, rel: str) -> str:
        """The normalized vault-relative path; refuses escapes, including symlinks out."""
        memo = self._listing
        if memo is not None and (done := memo.get(f"resolve:{rel}")) is not None:
            return done[0]
        # Across turns too: this check is for early, clear errors; a read opens the file from
        # the vault's descriptor and refuses a symlink out (PathOutsideVault all the same).
        shared = self._shared
        key = f"vault-resolve:{self.root}\x00{rel}"
        if shared is not None and isinstance(known := shared.get(key), str):
            norm = known
        else:
            norm = _normalize(rel)
            root = str(self.root)
            real = _realpath(os.path.join(root, norm))
            if real != root and not real.startswith(root.rstrip(os.sep) + os.sep):
                raise PathOutsideVault(rel, "path leads outside the vault through a symlink")
            if shared is not None:
                shared[key] = norm
        if memo is not None:
            memo[f"resolve:{rel}"] = (norm,)
        return norm

    def exists(self, rel: str) -> bool:
        """Whether ``rel`` is a readable note (overlay or a regular file, not hidden)."""
        norm = self.resolve(rel)
        if norm in self.overlay:
            return True
        return not _hidden(norm) and os.path.isfile(os.path.join(self.root, norm))

    def note_path(self, rel: str) -> str:
        """The resolved path of an existing note (``.md`` may be left off), else NoteNotFound."""
        norm = self.resolve(rel)
        if _is_note(norm) and self.exists(norm):
            return norm
        if not _is_note(norm) and norm != "." and self.exists(norm + ".md"):
            return self.resolve(norm + ".md")
        # ``.MD``, ``.Md``: the extension is matched case-insensitively, the name exactly.
        stem = norm[:-3] if _is_note(norm) else norm
        for found in self.notes():
            if found[:-3] == stem and found != norm:
                return found
        raise NoteNotFound(rel, self.suggest(rel), str(self.root))

    def read_text(self, rel: str) -> tuple[str, str | None]:
        """Text of a note (BOM stripped, newlines as ``\\n``) and a warning if bytes were bad."""
        norm = self.resolve(rel)
        if norm in self.overlay:
            return _clean(self.overlay[norm]), None
        if _hidden(norm):
            raise NoteNotFound(rel, self.suggest(rel), str(self.root))
        try:
            # Opened from the vault's folder one component at a time, then checked: a note
            # swapped for a symlink out of the vault after ``resolve`` is still refused.
            data = read_confined(self.root, norm, MAX_NOTE_BYTES)
        except FileProblem as exc:
            if exc.reason in ("missing", "directory"):
                raise NoteNotFound(rel, self.suggest(rel), str(self.root)) from None
            if exc.reason == "outside":
                raise PathOutsideVault(rel, exc.detail) from None
            if exc.reason == "too-large":
                raise AttachmentError(norm, f"note is larger than {MAX_NOTE_BYTES} bytes") from None
            raise AttachmentError(norm, f"cannot read: {exc.detail}") from None
        try:
            return _clean(data.decode("utf-8")), None
        except UnicodeDecodeError as exc:
            text = data.decode("utf-8", errors="replace")
            warning = (
                f"{norm}: not valid UTF-8 (first bad byte at offset {exc.start}); "
                "undecodable bytes were replaced with U+FFFD"
            )
            return _clean(text), warning

    def stamp(self, rel: str) -> FileStamp | None:
        """The stamp of a note on disk (see ``FileStamp``); None for an overlay note or a path
        that cannot be stat'ed. Reading stays ``read_text``'s: a stamp only says whether a
        read made before is still good."""
        norm = self.resolve(rel)
        if norm in self.overlay:
            return None
        try:
            st = os.stat(os.path.join(self.root, norm))
        except (OSError, ValueError):
            return None
        return FileStamp(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)

    def snapshot(self, shared: dict[str, Any] | None = None) -> Vault:
        """This vault, listed at most once: one turn resolves every link against one listing,
        and each path's symlink check is made once. A note's text is always read from disk.

        With ``shared`` (a conversation's cache) the disk walk itself is kept across turns
        and re-used while the modification times of the folders it walked are unchanged.
        """
        # A copy, not a new vault: the root was resolved and checked when this one was made
        # (a realpath and a stat on every turn otherwise).
        snap = object.__new__(Vault)
        for field in attrs.fields(Vault):
            object.__setattr__(snap, field.name, getattr(self, field.name))
        object.__setattr__(snap, "_listing", {})
        object.__setattr__(snap, "_shared", shared)
        return snap

    def notes(self) -> tuple[str, ...]:
        """Every ``.md`` note (disk and overlay), sorted by path; hidden folders skipped."""
        if self._listing is not None and "notes" in self._listing:
            return self._listing["notes"]
        listed = self._disk_listing()  # sorted: kept across turns as one tuple
        added = [p for p in self.overlay if _is_note(p) and not _hidden(p)]
        if added:
            listed = tuple(sorted({*listed, *added}))
        if self._listing is not None:
            self._listing["notes"] = listed
        return listed

    def folders(self) -> tuple[str, ...]:
        """Every folder that holds at least one note (at any depth), sorted."""
        dirs: set[str] = set()
        for rel in self.notes():
            parent = posixpath.dirname(rel)
            while parent:
                dirs.add(parent)
                parent = posixpath.dirname(parent)
        return tuple(sorted(dirs))

    def with_changes(self, changes: Mapping[str, str]) -> Vault:
        """A vault that sees ``changes`` (path -> text) over this one; disk is not written."""
        return Vault(self.root, {**self.overlay, **_overlay(changes)})

    def suggest(self, rel: str, candidates: tuple[str, ...] | None = None) -> tuple[str, ...]:
        """Close matches for a path that was not found, by full path and by file name."""
        pool = self.notes() if candidates is None else candidates
        wanted = str(rel).replace("\\", "/").strip().strip("/")
        if not wanted or not pool:
            return ()
        if candidates is None and not wanted.endswith(".md"):
            wanted += ".md"
        found = difflib.get_close_matches(wanted, pool, n=5, cutoff=0.6)
        by_name: dict[str, list[str]] = {}
        for path in pool:
            by_name.setdefault(posixpath.basename(path).lower(), []).append(path)
        name = posixpath.basename(wanted).lower()
        for close in difflib.get_close_matches(name, list(by_name), n=5, cutoff=0.6):
            found.extend(by_name[close])
        return tuple(dict.fromkeys(found))[:5]

    def _disk_listing(self) -> tuple[str, ...]:
        key = f"vault-listing:{self.root}"
        shared = self._shared
        if shared is not None:
            cached = shared.get(key)
            if isinstance(cached, _DiskListing) and cached.still_valid():
                return cached.notes
        taken = time.time_ns()
        folders: list[tuple[str, int]] = []
        symlinks: list[bool] = []
        notes = tuple(sorted(self._disk_notes(folders, symlinks)))
        if shared is not None and not symlinks:
            shared[key] = _DiskListing(notes, tuple(folders), taken)
        return notes

    def _disk_notes(self, folders: list[tuple[str, int]], symlinks: list[bool]) -> Iterator[str]:
        # scandir's entries know their type from the directory listing, so a walk costs
        # one listing per folder and a stat only for symlinks (link resolution lists the
        # vault on every note with links).
        root = str(self.root)
        prefix = root.rstrip(os.sep) + os.sep
        stack = [(root, "")]
        while stack:
            folder, rel_dir = stack.pop()
            try:
                folders.append((folder, os.stat(folder).st_mtime_ns))
                entries = list(os.scandir(folder))
            except OSError:
                continue
            for entry in entries:
                name = entry.name
                if name.startswith("."):
                    continue
                rel = f"{rel_dir}{name}"
                if entry.is_dir(follow_symlinks=False):
                    stack.append((entry.path, rel + "/"))
                    continue
                if not _is_note(name):
                    continue
                if entry.is_symlink():
                    symlinks.append(True)  # its target may change unseen: not kept
                    try:
                        if not os.path.realpath(entry.path).startswith(prefix):
                            continue
                    except OSError:  # swapped while we looked: not a note of this walk
                        continue
                    if not os.path.isfile(entry.path):
                        continue
                elif not entry.is_file(follow_symlinks=False):
                    continue
                yield rel


def _is_note(name: str) -> bool:
    """Notes are ``.md`` files, the extension in any case (``.MD`` too)."""
    return name[-3:].lower() == ".md"


def _realpath(path: str) -> str:
    """``os.path.realpath``, which raises when a symlink is swapped for a file mid-call.

    After a few tries the path is taken as written: this check only gives early, clear
    errors; every read opens the file from the vault's descriptor and cannot leave it.
    """
    for _ in range(3):
        try:
            return os.path.realpath(path)
        except OSError:
            continue
    return os.path.normpath(path)


def _clean(text: str) -> str:
    if text.startswith(_BOM):
        text = text[1:]
    return text.replace("\r\n", "\n").replace("\r", "\n")
