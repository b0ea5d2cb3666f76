"""A replay corpus: the recorded conversations, found in folders, list files and stores.

Finding a corpus reads each file's text (and extracts store conversations into scripts)
on the calling machine, so a worker receives everything but the vault: parsing happens
in the worker, where a broken conversation becomes that conversation's error.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import attrs

from lamina._script import MAX_SCRIPT_BYTES, Script, ScriptTurn
from lamina.pipeline import LaminaError, SystemPrompt
from lamina.pipeline.errors import ConfigError
from lamina.pipeline.inputs import FileProblem, read_regular
from lamina.pipeline.store import Store, is_postgres_url, open_store

__all__ = ["Corpus", "Recording", "find_corpus", "store_recordings"]

SCRIPT_SUFFIXES = (".yaml", ".yml", ".json")
# The most a transcript may hold (as `lamina import` reads; scripts: `lamina run`'s
# MAX_SCRIPT_BYTES): a larger corpus file is that conversation's error, never read whole.
MAX_TRANSCRIPT_BYTES = 64_000_000
_SQLITE_MAGIC = b"SQLite format 3\x00"


@attrs.frozen
class Recording:
    """One recorded conversation as shipped to a worker.

    ``source`` is "script", "transcript" or "store"; scripts and transcripts carry their
    file ``text``, store conversations an extracted ``script``. ``base`` resolves a
    script's relative vault; ``vault`` is the default vault (the corpus's, or the one the
    store saved). ``problems`` lists what extraction could not rebuild; ``failure`` says
    why the conversation could not be read at all.
    """

    id: str
    source: str
    path: str = ""
    text: str = ""
    base: str = ""
    vault: str = ""
    script: Script | None = None
    problems: tuple[str, ...] = ()
    failure: str = ""


@attrs.frozen
class Corpus:
    """Recordings in id order (ids are unique)."""

    recordings: tuple[Recording, ...]

    def __len__(self) -> int:
        return len(self.recordings)

    def __iter__(self) -> Iterator[Recording]:
        return iter(self.recordings)


def _is_store(path: Path) -> bool:
    try:
        with path.open("rb") as fh:
            return fh.read(len(_SQLITE_MAGIC)) == _SQLITE_MAGIC
    except OSError:
        return False


def _is_transcript(text: str) -> bool:
    """A markdown file is a chat transcript when it has a ``**user**:`` message (so the
    notes of a vault kept inside a corpus folder are not taken for chats)."""
    return text.startswith("**user**:") or "\n**user**:" in text


def _mentions_user(path: Path) -> bool:
    """Whether a file too large to read has a ``**user**:`` line: scanned a megabyte at a
    time, so a huge note in a corpus folder is skipped without being held in memory."""
    marker = b"\n**user**:"
    tail = b"\n"
    try:
        with path.open("rb") as fh:
            while chunk := fh.read(1 << 20):
                if marker in tail + chunk:
                    return True
                tail = chunk[-len(marker) :]
    except OSError:
        return True  # unreadable: reported as this conversation's error
    return False


def _file(path: Path, rid: str, vault: str) -> Recording | None:
    if _is_store(path):
        return None
    suffix = path.suffix.lower()
    source = "transcript" if suffix == ".md" else "script"
    cap = MAX_TRANSCRIPT_BYTES if source == "transcript" else MAX_SCRIPT_BYTES
    try:
        text = read_regular(path, cap).decode("utf-8")
    except FileProblem as exc:
        if exc.reason == "too-large" and source == "transcript" and not _mentions_user(path):
            return None
        return Recording(rid, source, str(path), failure=f"cannot read: {exc.detail}")
    except UnicodeDecodeError as exc:
        return Recording(rid, source, str(path), failure=f"cannot read: {exc}")
    if suffix == ".md":
        if not _is_transcript(text):
            return None
        return Recording(rid, "transcript", str(path), text, str(path.parent), vault)
    return Recording(rid, "script", str(path), text, str(path.parent.resolve()), vault)


def _walk(folder: Path) -> list[Path]:
    return sorted(
        p
        for p in folder.rglob("*")
        if p.is_file()
        and not any(part.startswith(".") for part in p.relative_to(folder).parts)
        and (p.suffix.lower() in (*SCRIPT_SUFFIXES, ".md") or _is_store(p))
    )


def _listed(list_file: Path) -> list[tuple[Path, str]]:
    """Entries of a list file: one path per line (relative to the file), ``#`` comments;
    ``STORE#ID`` names one conversation of a store."""
    try:
        lines = list_file.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError("corpus", f"{list_file}: cannot read: {exc}") from None
    out: list[tuple[Path, str]] = []
    for line in lines:
        entry = line.strip()
        if not entry or entry.startswith("#"):
            continue
        name, _, cid = entry.partition("#")
        out.append((list_file.parent / name.strip(), cid.strip()))
    return out


def store_recordings(
    path: str | Path, ids: Sequence[str] = (), *, vault: str = "", prefix: str = ""
) -> list[Recording]:
    """Every (or each named) conversation of a store (a SQLite file or a PostgreSQL URL),
    extracted into a script."""
    p = str(path)
    if not is_postgres_url(p) and not Path(p).is_file():
        raise ConfigError("store", f"{p}: no such store file")
    out: list[Recording] = []
    with open_store(p, read_only=True) as store:
        wanted = list(ids) or [info.id for info in store.conversations()]
        for cid in wanted:
            rid = f"{prefix}{cid}"
            try:
                out.append(_from_store(store, cid, rid, vault))
            except LaminaError as exc:
                out.append(Recording(rid, "store", str(p), failure=" ".join(str(exc).split())))
    return out


def _from_store(store: Store, cid: str, rid: str, vault: str) -> Recording:
    info = store.conversation(cid)
    records = store.turns(cid)
    problems: list[str] = []
    turns: list[ScriptTurn] = []
    before: dict[str, str] = {}
    system = SystemPrompt()
    for record in records:
        state = store.load(cid, record.turn)
        if record.turn == 1:
            system = state.last_system or state.system
        changes = tuple(sorted((p, t) for p, t in state.vault_changes if before.get(p) != t))
        before = dict(state.vault_changes)
        forms = []
        for a in record.attachments:
            form = a.data() if a.rebuilt else None
            if form is None:
                problems.append(f"turn {record.turn}: {a.kind} {a.label}: not kept in the store")
            else:
                forms.append(form)
        turns.append(ScriptTurn(record.user, tuple(forms), record.reply, changes))
    if not turns:
        raise ConfigError("store", f"conversation {cid} has no turns")
    root = vault or info.vault
    script = Script(f"{store.path}#{cid}", system, tuple(turns), Path(root) if root else None)
    return Recording(rid, "store", store.path, script=script, vault=root, problems=tuple(problems))


def find_corpus(
    paths: str | Path | Iterable[str | Path] = (),
    *,
    store: str | Path | None = None,
    vault: str | Path | None = None,
) -> Corpus:
    """The conversations under ``paths`` (folders, list files, scripts, transcripts,
    store files) and in ``store``; ``vault`` is the vault of those that name none."""
    items = [paths] if isinstance(paths, (str, Path)) else list(paths)
    default_vault = "" if vault is None else str(Path(vault).resolve())
    found: list[Recording] = []
    for item in items:
        root = Path(item)
        if root.is_dir():
            for p in _walk(root):
                rid = p.relative_to(root).as_posix()
                found.extend(_one(p, "", rid, default_vault))
        elif root.is_file() and root.suffix.lower() in (".txt", ".list", ".lst"):
            for p, cid in _listed(root):
                found.extend(_one(p, cid, _rel(p, root.parent), default_vault))
        elif root.is_file():
            found.extend(_one(root, "", root.name, default_vault))
        else:
            raise ConfigError("corpus", f"{root}: no such file or folder")
    if store is not None:
        found.extend(
            store_recordings(store, vault=default_vault, prefix=f"{Path(store).name}#")
        )
    seen: set[str] = set()
    for r in found:
        if r.id in seen:
            raise ConfigError("corpus", f"conversation {r.id!r} is listed twice")
        seen.add(r.id)
    if not found:
        raise ConfigError("corpus", "no conversations found")
    return Corpus(tuple(sorted(found, key=lambda r: r.id)))


def _rel(path: Path, base: Path) -> str:
    try:
        return path.relative_to(base).as_posix()
    except ValueError:
        return path.as_posix()


def _one(path: Path, cid: str, rid: str, vault: str) -> list[Recording]:
    if not path.is_file():
        return [Recording(rid, "script", str(path), failure="no such file")]
    if _is_store(path):
        try:
            return store_recordings(path, [cid] if cid else (), vault=vault, prefix=f"{rid}#")
        except LaminaError as exc:  # not a Lamina store, or one this Lamina cannot read
            return [Recording(rid, "store", str(path), failure=" ".join(str(exc).split()))]
    recording = _file(path, rid, vault)
    return [] if recording is None else [recording]
