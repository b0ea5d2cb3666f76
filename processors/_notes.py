"""Notes, folders and tags from a vault: frontmatter, body, inline tags and wikilinks.

Wikilinks become provenance edges (``links`` / ``embeds``); they are never expanded here.
"""

from __future__ import annotations

import bisect
import datetime
import functools
import json
import posixpath
import re
import time
from collections.abc import Callable, Mapping
from typing import Any, Literal, Self

import attrs

from lamina.pipeline import Artifact
from lamina.pipeline.errors import AttachmentError, NotRebuilt
from lamina.pipeline.inputs import LoadError, LoadLimits, load_yaml
from lamina.pipeline.sources import LabelLookup, Link, Processed, TurnWarning, make_artifact
from lamina.pipeline.text import fence_after, split_sections, text_hash
from lamina.processors._context import DISPLAY_PROPERTIES, NoteOptions, ProcessContext
from lamina.processors._processor import BaseProcessor
from lamina.processors._vault import FileStamp, Vault

__all__ = [
    "FolderProcessor",
    "FolderSpec",
    "NotePayload",
    "NoteProcessor",
    "NoteSpec",
    "TagProcessor",
    "TagSpec",
    "WikiLink",
    "folder",
    "note",
    "note_section",
    "parse_note",
    "resolve_link",
    "tag",
]

# A code span: a backtick run, then the shortest text (not starting with the run) up to
# the same run, on one line.
_INLINE_CODE = re.compile(r"`(`*)(?!`\1)[^\n]+?`\1")
_WIKILINK = re.compile(r"\[\[([^\[\]\n]+?)\]\]")  # "!" before it makes an embed
# A tag starts after whitespace or line start (checked by the caller) and needs at least
# one non-digit.
_INLINE_TAG = re.compile(r"#([\w/-]+)")
_TAG_TEXT = re.compile(r"^[\w/-]+$")
# Frontmatter is a few properties; anything near these limits is an attack or an accident.
_FRONTMATTER_LIMITS = LoadLimits(max_chars=1_000_000, max_depth=32, max_nodes=50_000)


@attrs.frozen
class WikiLink:
    """``[[target#subpath|alias]]`` or an embed ``![[...]]``; ``subpath`` is ``heading`` or
    ``^block`` without the ``#``, kept separately from the target."""

    target: str
    alias: str | None = None
    embed: bool = False
    subpath: str | None = None


@functools.lru_cache(maxsize=64)
def _with_properties(properties: tuple[tuple[str, str], ...], body_text: str) -> str:
    """The ``---`` properties header above the body: made once per note version, not on
    every ``body()`` call (hashing, rendering and previews ask many times a turn, and each
    call would copy the whole note). Keyed by the strings themselves, whose hashes Python
    keeps."""
    lines = "\n".join(f"{k}: {v}" if v else f"{k}:" for k, v in properties)
    return f"---\n{lines}\n---\n{body_text}"


@attrs.frozen
class NotePayload:
    """One note (or, with ``section``, one heading's section or ``^block`` of it): identity
    (path), title, metadata from frontmatter and body, the body.

    ``properties`` are the frontmatter's fields as (key, compact value), rendered as a
    ``---`` header above the body so the model reads them as the note has them.
    """

    path: str
    title: str
    aliases: tuple[str, ...]
    tags: tuple[str, ...]
    body_text: str
    links: tuple[WikiLink, ...]
    properties: tuple[tuple[str, str], ...] = ()
    section: str = ""

    @property
    def locator(self) -> str:
        return f"{self.path}#{self.section}" if self.section else self.path

    def body(self) -> str:
        if not self.properties:
            return self.body_text
        return _with_properties(self.properties, self.body_text)

    def attributes(self) -> tuple[tuple[str, str], ...]:
        if self.section:
            return (("path", self.path), ("section", self.section))
        return (("path", self.path),)

    def replace_text(self, fn: Callable[[str], str]) -> Self:
        """Map the body and property values; path and title are the note's identity and stay."""
        return attrs.evolve(
            self,
            body_text=fn(self.body_text),
            properties=tuple((k, fn(v)) for k, v in self.properties),
        )

    def has_tag(self, query: str) -> bool:
        """Whether the note carries ``query`` or a tag nested below it (``a/b`` matches ``a``)."""
        wanted = normalize_tag(query)
        return any(t == wanted or t.startswith(wanted + "/") for t in self.tags)


# --- parsing -------------------------------------------------------------------------


def normalize_tag(raw: str) -> str:
    """Tag text without ``#``, outer slashes or case: ``#Project/Lamina`` -> ``project/lamina``."""
    return raw.strip().lstrip("#").strip("/").lower()


def _valid_tag(tag: str) -> bool:
    return bool(tag) and bool(_TAG_TEXT.match(tag)) and not tag.replace("/", "").isdigit()


def _split_frontmatter(path: str, text: str) -> tuple[dict[str, Any], str, list[str]]:
    """Frontmatter mapping, the body, and warnings; bad frontmatter is left in the body."""
    if not text.startswith("---"):
        return {}, text, []
    lines = text.split("\n")
    if lines[0].rstrip() != "---":
        return {}, text, []
    for i in range(1, len(lines)):
        if lines[i].rstrip() in ("---", "..."):
            break
    else:
        return {}, text, [f"{path}: frontmatter is not closed by '---'; read as body"]
    raw = "\n".join(lines[1:i])
    body = "\n".join(lines[i + 1 :]).lstrip("\n")
    try:
        data = load_yaml(raw, _FRONTMATTER_LIMITS)
    except LoadError as exc:
        where = f" at line {exc.line + 1}" if exc.line else ""
        # A syntax error is named by its line; a limit (alias bomb, depth, number) by itself.
        detail = "" if exc.problem.startswith("not valid YAML") else f" ({exc.problem})"
        return {}, text, [f"{path}: malformed YAML frontmatter{where}{detail}; read as body"]
    if data is None:
        return {}, body, []
    if not isinstance(data, dict):
        return {}, text, [f"{path}: frontmatter is not a mapping; read as body"]
    return data, body, []


def _strings(value: Any, *, split_spaces: bool) -> list[str]:
    """Frontmatter list-ish values: a list, or a comma (and optionally space) separated string."""
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [str(v).strip() for v in value if v is not None and not isinstance(v, (dict, list))]
    if isinstance(value, (dict, bool)):
        return []
    parts = re.split(r"[,\s]+" if split_spaces else r",", str(value))
    return [p.strip() for p in parts if p.strip()]


# Literal-first patterns: the regex engine then skips to candidates instead of trying
# every position of the body; a body without the literal is not scanned at all (a str
# search is about ten times faster than the engine's).
_FENCE_RUNS = (("```", re.compile(r"```+")), ("~~~", re.compile(r"~~~+")))


def _fence_lines(body: str) -> list[tuple[int, int, str]]:
    """(line start, line end, fence run) of each line starting with a fence, in order."""
    found: list[tuple[int, int, str]] = []
    for literal, pattern in _FENCE_RUNS:
        if literal not in body:
            continue
        for m in pattern.finditer(body):
            start = body.rfind("\n", 0, m.start()) + 1
            if m.start() - start > 3 or body[start : m.start()].strip(" "):
                continue
            end = body.find("\n", m.end())
            found.append((start, len(body) if end < 0 else end, m.group()))
    found.sort()
    return found


def _fenced(body: str) -> list[tuple[int, int]]:
    """The fenced code blocks of ``body``: (first fence line's start, closing fence line's
    end), the end of the body for a block never closed."""
    blocks: list[tuple[int, int]] = []
    opened = 0
    fence: str | None = None
    for line_start, line_end, mark in _fence_lines(body):
        rest = body[line_start:line_end].lstrip(" ")[len(mark) :]
        was, fence = fence, fence_after(fence, mark, rest)
        if was is None and fence is not None:
            opened = line_start
        elif was is not None and fence is None:
            blocks.append((opened, line_end))
    if fence is not None:
        blocks.append((opened, len(body)))
    return blocks


def _code_free_text(body: str) -> str:
    """The body without fenced code blocks (fence lines included), inline code spans blanked.

    Lines are kept whole, so per-line patterns (links, tags) find what they would find
    line by line; only the few fence lines are looked at in Python.
    """
    pieces: list[str] = []
    start = 0
    for opened, closed in _fenced(body):
        pieces.append(body[start:opened])
        start = closed
    if start < len(body) or start == 0:
        pieces.append(body[start:])
    text = "\n".join(pieces)
    return _INLINE_CODE.sub(" ", text) if "`" in text else text


def _without_comments(body: str) -> str:
    """``body`` as Obsidian's reading view shows it: each ``%%`` comment (within a line or
    over lines, up to the next ``%%``; one never closed runs to the end) taken out, its
    lines too where it fills them. ``%%`` in fenced code or a code span is text."""
    if "%%" not in body:
        return body
    code = _fenced(body)
    start = 0
    for opened, closed in [*code, (len(body), len(body))]:
        text = body[start:opened]
        if "`" in text:
            code += [(start + m.start(), start + m.end()) for m in _INLINE_CODE.finditer(text)]
        start = closed
    code.sort()  # apart from each other: spans are looked for outside the fenced blocks
    starts = [opened for opened, _ in code]
    marks: list[int] = []
    at = body.find("%%")
    while at >= 0:
        i = bisect.bisect_right(starts, at) - 1
        if i >= 0 and at < code[i][1]:  # in code: text, look on after it
            at = body.find("%%", code[i][1])
            continue
        marks.append(at)
        at = body.find("%%", at + 2)
    pieces: list[str] = []
    start = 0
    for i in range(0, len(marks), 2):
        cut = marks[i]
        end = marks[i + 1] + 2 if i + 1 < len(marks) else len(body)
        line_start = cut  # back over the blanks before it (not to the line's start: a
        while line_start and body[line_start - 1] != "\n" and body[line_start - 1].isspace():
            line_start -= 1  # long line of comments would be read once for each)
        alone = line_start == 0 or body[line_start - 1] == "\n"
        if alone and body[end : end + 1] in ("\n", ""):
            cut, end = line_start, end + 1  # the comment fills its lines: they go too
        pieces.append(body[start:cut])
        start = min(end, len(body))
    pieces.append(body[start:])
    return "".join(pieces)


def _links_and_tags(body: str) -> tuple[list[WikiLink], list[str]]:
    if "[[" not in body and "#" not in body:
        return [], []
    text = _code_free_text(body)
    links: list[WikiLink] = []
    for m in _WIKILINK.finditer(text) if "[[" in text else ():
        inner = m.group(1).replace("\\|", "|")
        target, bar, alias = inner.partition("|")
        target, hash_, subpath = target.partition("#")
        links.append(
            WikiLink(
                target=target.strip(),
                alias=alias.strip() or None if bar else None,
                embed=m.start() > 0 and text[m.start() - 1] == "!",
                subpath=subpath.strip() or None if hash_ else None,
            )
        )
    if "#" not in text:
        return links, []
    if links:
        text = _WIKILINK.sub(" ", text)
    tags: list[str] = []
    for m in _INLINE_TAG.finditer(text):
        if m.start() == 0 or text[m.start() - 1].isspace():
            tag_ = normalize_tag(m.group(1))
            if _valid_tag(tag_):
                tags.append(tag_)
    return links, tags


_FLOW_SPECIAL = re.compile(r"[,\[\]{}#:\n\"']|^\s|\s$")


def _compact(value: Any, nested: bool = False) -> str:
    """A property value on one line: scalars as written, lists and maps in YAML flow style
    (an item that would break the flow is quoted)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, str):
        special = _FLOW_SPECIAL.search(value) if nested else "\n" in value
        return json.dumps(value, ensure_ascii=False) if special else value
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_compact(v, True) for v in value) + "]"
    if isinstance(value, dict):
        items = (f"{_compact(k, True)}: {_compact(v, True)}" for k, v in value.items())
        return "{" + ", ".join(items) + "}"
    return str(value)


def _properties(meta: Mapping[Any, Any]) -> tuple[tuple[str, str], ...]:
    """Every frontmatter field but ``title`` (already the note's title), in written order."""
    return tuple((str(k), _compact(v)) for k, v in meta.items() if str(k) != "title")


def parse_note(
    path: str, text: str, *, comments: Literal["hidden", "kept"] = "hidden"
) -> tuple[NotePayload, tuple[TurnWarning, ...]]:
    """A note's payload from its text, and warnings (bad frontmatter never raises: the
    text is kept as the body). ``%%comments%%`` are taken out of the body, and its links
    read from what is left, unless ``comments="kept"`` (``NoteOptions.comments``); its
    tags are read from the whole body, comments included."""
    meta, raw, problems = _split_frontmatter(path, text)
    body = _without_comments(raw) if comments == "hidden" else raw
    warnings = tuple(
        TurnWarning("frontmatter-malformed", f"note:{path}", p.removeprefix(f"{path}: "))
        for p in problems
    )
    stem = posixpath.splitext(posixpath.basename(path))[0]
    title_value = meta.get("title")
    title = stem
    if title_value is not None and not isinstance(title_value, (dict, list, bool)):
        title = str(title_value).strip() or stem
    front_tags = _strings(meta.get("tags", meta.get("tag")), split_spaces=True)
    aliases = _strings(meta.get("aliases", meta.get("alias")), split_spaces=False)
    links, inline_tags = _links_and_tags(body)
    if body is not raw:  # a tag in a comment still tags the note (a hidden tag: Obsidian
        _, inline_tags = _links_and_tags(raw)  # indexes it), a link there is not shown
    tags = {normalize_tag(t) for t in front_tags} | set(inline_tags)
    payload = NotePayload(
        path=path,
        title=title,
        aliases=tuple(dict.fromkeys(a for a in aliases if a)),
        tags=tuple(sorted(t for t in tags if _valid_tag(t))),
        body_text=body,
        links=tuple(links),
        properties=_properties(meta),
    )
    return payload, warnings


def _heading_text(line: str) -> str:
    return " ".join(line.strip().lstrip("#").strip().rstrip("#").split()).casefold()


def note_section(body: str, subpath: str) -> str | None:
    """The part of ``body`` an embed's ``#subpath`` names: a heading's section (down to the
    next heading of its level or above; ``A#B`` names B) or a ``^block``'s paragraph."""
    if subpath.startswith("^"):
        # Obsidian also takes an id right after an embed: ``![[x.png]]^id``.
        marker = re.compile(rf"(?<![\w^])\^{re.escape(subpath[1:])}\s*$")
        for paragraph in re.split(r"\n\s*\n", body):
            if any(marker.search(line) for line in paragraph.split("\n")):
                return paragraph.strip("\n")
        return None
    wanted = " ".join(subpath.split("#")[-1].split()).casefold()
    found: list[str] = []
    level = 0
    for heading, text in split_sections(body):
        depth = len(heading) - len(heading.lstrip("#")) if heading else 0
        if found:
            if heading is not None and depth <= level:
                break
            found.append(f"{heading}\n{text}" if heading else text)
        elif heading is not None and _heading_text(heading) == wanted:
            level = depth
            found.append(f"{heading}\n{text}")
    return "".join(found).strip("\n") if found else None


@functools.lru_cache(maxsize=8)
def _note_index(notes: tuple[str, ...]) -> tuple[frozenset[str], dict[str, tuple[str, ...]]]:
    """The notes as a set and by case-folded file name (for suffix and name matches)."""
    by_name: dict[str, list[str]] = {}
    for n in notes:
        by_name.setdefault(posixpath.basename(n.casefold()), []).append(n)
    return frozenset(notes), {k: tuple(v) for k, v in by_name.items()}


def resolve_link(target: str, source: str, notes: tuple[str, ...]) -> str | None:
    """Obsidian-style: ``./``/``../`` relative to the source note only; else the exact vault
    path, then relative to the source, then by path suffix / file name (fewest folders,
    then shortest, then sorted path wins); else None."""
    name = target.strip().replace("\\", "/").lstrip("/")
    if not name:
        return None
    # Only notes resolve: "diagram.png" looks for "diagram.png.md" and stays unresolved.
    wanted = name if name.lower().endswith(".md") else name + ".md"
    known, by_name = _note_index(notes)
    relative = posixpath.normpath(posixpath.join(posixpath.dirname(source), wanted))
    if wanted.startswith(("./", "../")):
        return relative if relative in known else None
    exact = posixpath.normpath(wanted)
    if exact in known:
        return exact
    if relative in known:
        return relative
    folded = wanted.casefold()
    candidates = by_name.get(posixpath.basename(folded), ())
    matches = [
        n for n in candidates if n.casefold() == folded or n.casefold().endswith("/" + folded)
    ]
    if not matches:
        return None
    return min(matches, key=lambda n: (n.count("/"), len(n), n))


# --- specs ---------------------------------------------------------------------------


def _path_arg(kind: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise AttachmentError(f"{kind} {value!r}"[:80], f"a {kind} path must be a non-empty string")
    return value


@attrs.frozen
class NoteSpec:
    """Attach one note by vault-relative path (``.md`` may be left off)."""

    path: str

    @property
    def kind(self) -> str:
        return "note"

    def describe(self) -> str:
        return f"note {self.path}"


@attrs.frozen
class FolderSpec:
    """Attach every note below a folder, sorted by path."""

    path: str

    @property
    def kind(self) -> str:
        return "folder"

    def describe(self) -> str:
        return f"folder {self.path}"


@attrs.frozen
class TagSpec:
    """Attach every note tagged ``#tag`` or a tag nested below it; ``tag`` is normalized."""

    tag: str

    @property
    def kind(self) -> str:
        return "tag"

    def describe(self) -> str:
        return f"tag #{self.tag}"


def note(path: str) -> NoteSpec:
    """Spec for one note, e.g. ``note("docs/api-docs.md")``."""
    return NoteSpec(_path_arg("note", path))


def folder(path: str) -> FolderSpec:
    """Spec for all notes below a folder, e.g. ``folder("docs")``."""
    return FolderSpec(_path_arg("folder", path))


def tag(name: str) -> TagSpec:
    """Spec for the notes tagged ``name`` (``"#a"`` also matches notes tagged ``#a/b``)."""
    if not isinstance(name, str):
        raise AttachmentError(f"tag {name!r}"[:80], "a tag must be a string like '#project'")
    norm = normalize_tag(name)
    if not _valid_tag(norm):
        raise AttachmentError(
            f"tag {name}", "not a valid tag (letters, digits, _ - / and at least one non-digit)"
        )
    return TagSpec(norm)


def _script_field(kind: str, data: Mapping[str, Any]) -> Any:
    extra = sorted(str(k) for k in data if k != kind)
    if extra:
        raise AttachmentError(
            f"{kind} {data.get(kind)!r}"[:80], f"unknown fields: {', '.join(extra)}"
        )
    return data.get(kind)


# --- processing ----------------------------------------------------------------------


def _need_vault(ctx: ProcessContext, what: str) -> Vault:
    if ctx.vault is None:
        raise AttachmentError(what, "a vault is required to attach notes (none was given)")
    return ctx.vault


@attrs.frozen
class _Parsed:
    """A note's text parsed once: the payload with every property, its warnings, and the
    payload as each properties setting shows it (so a setting yields one object per text)."""

    payload: NotePayload
    warnings: tuple[TurnWarning, ...]
    shown: dict[NoteOptions, NotePayload] = attrs.field(factory=dict, eq=False)


@attrs.frozen
class _Loaded:
    """What the last read of a note file gave, with its stamp (see ``FileStamp``)."""

    stamp: FileStamp
    options: NoteOptions
    payload: NotePayload
    warnings: tuple[TurnWarning, ...]


def _shown(payload: NotePayload, options: NoteOptions) -> NotePayload:
    """The payload with the properties ``options`` show."""
    wanted = options.properties
    if wanted == "all":
        return payload
    if wanted == "none":
        return attrs.evolve(payload, properties=())
    if wanted == "auto":
        shown = tuple((k, v) for k, v in payload.properties if k not in DISPLAY_PROPERTIES)
        return payload if shown == payload.properties else attrs.evolve(payload, properties=shown)
    have = dict(payload.properties)
    return attrs.evolve(payload, properties=tuple((k, have[k]) for k in wanted if k in have))


def _load(
    vault: Vault,
    rel: str,
    cache: dict[str, Any] | None = None,
    options: NoteOptions | None = None,
    *,
    refresh: bool = False,
) -> tuple[NotePayload, list[TurnWarning]]:
    """Read and parse a note. With a conversation cache, an unchanged text is parsed once
    (one payload object per text and setting), and a file whose stamp is that of an
    earlier settled read is not read again (unless ``refresh``)."""
    options = options or NoteOptions()
    key = f"note-read:{rel}"
    stamp = None if cache is None or refresh else vault.stamp(rel)
    last = None if cache is None else cache.get(key)
    if isinstance(last, _Loaded) and last.stamp == stamp and last.options == options:
        return last.payload, list(last.warnings)
    read_ns = time.time_ns()
    if cache is not None and stamp is None:
        stamp = vault.stamp(rel)
    text, decode_warning = vault.read_text(rel)
    memo = f"note-parse:{rel}:{text_hash(text)}:{options.comments}"
    parsed = None if cache is None else cache.get(memo)
    if not isinstance(parsed, _Parsed):
        parsed = _Parsed(*parse_note(rel, text, comments=options.comments))
        if cache is not None:
            cache[memo] = parsed
    payload = parsed.shown.get(options)
    if payload is None:
        payload = parsed.shown[options] = _shown(parsed.payload, options)
    decoded = (
        (TurnWarning("note-not-utf8", f"note:{rel}", decode_warning.removeprefix(f"{rel}: ")),)
        if decode_warning
        else ()
    )
    warnings = decoded + parsed.warnings
    if cache is not None and stamp is not None and stamp.settled(read_ns):
        cache[key] = _Loaded(stamp, options, payload, warnings)
    return payload, list(warnings)


# Embeds of these are files, not notes: they stay as written, without a warning.
_NOT_NOTE = re.compile(r"\.(?!md$)[A-Za-z0-9]{1,5}$", re.IGNORECASE)


@attrs.frozen
class _Embedding:
    """What inlining a note's embeds found: the artifacts, their edges and warnings."""

    artifacts: list[Artifact] = attrs.Factory(list)
    links: list[Link] = attrs.Factory(list)
    warnings: list[TurnWarning] = attrs.Factory(list)


def _embed(
    payload: NotePayload,
    vault: Vault,
    notes: tuple[str, ...],
    ctx: ProcessContext,
    out: _Embedding,
    seen: set[str],
    depth: int = 1,
) -> None:
    """Collect what ``payload`` embeds inline (sections always, whole notes when small),
    depth first in text order; a key already seen is linked to but not read again."""
    options = ctx.notes
    source = f"note:{payload.locator}"
    for link in payload.links:
        if not link.embed or not link.target:
            continue
        resolved = resolve_link(link.target, payload.path, notes)
        written = f"![[{link.target}{'#' + link.subpath if link.subpath else ''}]]"
        if resolved is None:
            if not _NOT_NOTE.search(link.target):
                out.warnings.append(
                    TurnWarning("embed-missing", source, f"{written} names no note in the vault")
                )
            continue
        if options.embeds == "links":
            continue
        if depth > options.embed_depth:
            out.warnings.append(
                TurnWarning(
                    "embed-too-deep",
                    source,
                    f"{written} is nested deeper than {options.embed_depth} embeds; "
                    "kept as a link",
                )
            )
            continue
        key = f"note:{resolved}#{link.subpath}" if link.subpath else f"note:{resolved}"
        if key in seen:  # a cycle or a repeat: the edge is enough
            out.links.append(Link(source, key, "embeds", inline=True))
            continue
        target, found = _load(vault, resolved, ctx.cache, options, refresh=ctx.refresh)
        out.warnings.extend(found)
        if link.subpath:
            text = note_section(target.body_text, link.subpath)
            if text is None:
                out.warnings.append(
                    TurnWarning(
                        "embed-section-missing",
                        source,
                        f"{written}: {resolved} has no such heading or block",
                    )
                )
                continue
            section_links, _ = _links_and_tags(text)
            target = attrs.evolve(
                target, body_text=text, links=tuple(section_links), section=link.subpath,
                properties=(),
            )
        elif len(target.body()) > options.embed_max_chars:
            continue  # a large note stays a link; attach it to send it whole
        seen.add(key)
        out.artifacts.append(make_artifact("note", key, target, recoverable=True))
        out.links.append(Link(source, key, "embeds", inline=True))
        out.links.extend(_note_links(target, notes))
        _embed(target, vault, notes, ctx, out, seen, depth + 1)


def _note_artifact(payload: NotePayload) -> Artifact:
    return make_artifact("note", f"note:{payload.path}", payload, recoverable=True)


def _note_links(payload: NotePayload, notes: tuple[str, ...]) -> list[Link]:
    source = f"note:{payload.locator}"
    edges: list[Link] = []
    for link in payload.links:
        if not link.target:
            continue  # [[#heading]] points into the note itself
        resolved = resolve_link(link.target, payload.path, notes)
        target = f"note:{resolved}" if resolved else f"unresolved:{link.target}"
        edges.append(Link(source, target, "embeds" if link.embed else "links"))
    return list(dict.fromkeys(edges))


def _notes_processed(
    payloads: list[NotePayload],
    notes: tuple[str, ...],
    group: str | None,
    warnings: list[TurnWarning],
    vault: Vault,
    ctx: ProcessContext,
) -> Processed:
    links: list[Link] = []
    if group is not None:
        links.extend(Link(group, f"note:{p.path}", "contains") for p in payloads)
    for p in payloads:
        links.extend(_note_links(p, notes))
    embedding = _Embedding()
    attached = {f"note:{p.path}" for p in payloads}
    for p in payloads:
        if any(link.embed for link in p.links):
            _embed(p, vault, notes, ctx, embedding, {f"note:{p.path}"})
    # An inlined embed's edge takes the place of its plain one, in text order.
    links.extend(embedding.links)
    inline = {(k.source, k.target) for k in embedding.links if k.inline}
    links = [attrs.evolve(k, inline=True) if (k.source, k.target) in inline else k for k in links]
    embedded = {a.key: a for a in embedding.artifacts if a.key not in attached}
    return Processed(
        artifacts=tuple(_note_artifact(p) for p in payloads),
        group=group,
        links=tuple(dict.fromkeys(links)),
        warnings=(*warnings, *embedding.warnings),
        embedded=tuple(embedded.values()),
    )


@attrs.frozen
class _Made:
    """A note spec's result and what it was made from (a note without embeds)."""

    payload: NotePayload
    warnings: tuple[TurnWarning, ...]
    notes: tuple[str, ...]
    processed: Processed

    def matches(
        self, payload: NotePayload, warnings: list[TurnWarning], notes: tuple[str, ...]
    ) -> bool:
        return self.payload is payload and self.warnings == tuple(warnings) and self.notes == notes


def _vault_for_label(ctx: ProcessContext, kind: str, label: str) -> Vault:
    if ctx.vault is None:
        raise NotRebuilt(kind, label, "no vault given to read notes from")
    return ctx.vault


def resolve_note(label: str, notes: tuple[str, ...]) -> tuple[str | None, str]:
    """A vault path for a transcript's note label (by path, else by a unique basename),
    or None and why not."""
    name = label.strip().lstrip("/")
    wanted = name if name.lower().endswith(".md") else name + ".md"
    if wanted in notes:
        return wanted, ""
    base = posixpath.basename(wanted).casefold()
    matches = sorted(n for n in notes if posixpath.basename(n).casefold() == base)
    if len(matches) == 1:
        return matches[0], ""
    if matches:
        return None, f"ambiguous basename: matches {', '.join(matches)}"
    return None, "no such note in the vault (deleted or renamed?)"


@attrs.frozen
class NoteProcessor(BaseProcessor):
    """``{"note": path}``: one note artifact plus its wikilink edges."""

    category = "Notes"

    @property
    def kind(self) -> str:
        return "note"

    def parse(self, data: Mapping[str, Any]) -> NoteSpec:
        return note(_script_field("note", data))

    def script_form(self, spec: NoteSpec) -> dict[str, Any]:
        return {"note": spec.path}

    def from_label(
        self, label: str, lookup: LabelLookup, ctx: ProcessContext
    ) -> tuple[dict[str, Any], str]:
        """The note by its path, else by a unique basename (a transcript may drop folders)."""
        vault = _vault_for_label(ctx, "note", label)
        path, why = resolve_note(label, vault.notes())
        if path is None:
            raise NotRebuilt("note", label, why)
        return {"note": path}, path

    def process(self, spec: NoteSpec, ctx: ProcessContext) -> Processed:
        vault = _need_vault(ctx, spec.describe())
        rel = vault.note_path(spec.path)
        payload, warnings = _load(vault, rel, ctx.cache, ctx.notes, refresh=ctx.refresh)
        # Listing the vault costs a walk of every folder: only link resolution needs it.
        notes = vault.notes() if payload.links else ()
        if any(link.embed for link in payload.links):  # embeds read other notes: made anew
            return _notes_processed([payload], notes, None, warnings, vault, ctx)
        # The same payload object is the same text under the same setting (see ``_load``):
        # with the same warnings and listing, the result is the one made before.
        key = f"note-processed:{rel}"
        last = ctx.cache.get(key)
        if isinstance(last, _Made) and last.matches(payload, warnings, notes):
            return last.processed
        processed = _notes_processed([payload], notes, None, warnings, vault, ctx)
        ctx.cache[key] = _Made(payload, tuple(warnings), notes, processed)
        return processed


@attrs.frozen
class FolderProcessor(BaseProcessor):
    """``{"folder": path}``: every note below the folder, sorted by path, as a group."""

    category = "Folders"

    @property
    def kind(self) -> str:
        return "folder"

    def parse(self, data: Mapping[str, Any]) -> FolderSpec:
        return folder(_script_field("folder", data))

    def script_form(self, spec: FolderSpec) -> dict[str, Any]:
        return {"folder": spec.path}

    def from_label(
        self, label: str, lookup: LabelLookup, ctx: ProcessContext
    ) -> tuple[dict[str, Any], str]:
        _vault_for_label(ctx, "folder", label)
        return {"folder": label}, label

    def process(self, spec: FolderSpec, ctx: ProcessContext) -> Processed:
        vault = _need_vault(ctx, spec.describe())
        rel = vault.resolve(spec.path)
        notes = vault.notes()
        if rel in notes:
            raise AttachmentError(spec.describe(), "is a note, not a folder; attach it as a note")
        members = list(notes) if rel == "." else [n for n in notes if n.startswith(rel + "/")]
        if not members:
            if rel == "." or rel in vault.folders() or (vault.root / rel).is_dir():
                raise AttachmentError(spec.describe(), "the folder holds no notes")
            hints = vault.suggest(rel, vault.folders())
            hint = f" (did you mean: {', '.join(hints)}?)" if hints else ""
            raise AttachmentError(spec.describe(), f"no such folder in the vault{hint}")
        payloads: list[NotePayload] = []
        warnings: list[TurnWarning] = []
        for member in members:
            payload, found = _load(vault, member, ctx.cache, ctx.notes, refresh=ctx.refresh)
            payloads.append(payload)
            warnings.extend(found)
        return _notes_processed(payloads, notes, f"folder:{rel}", warnings, vault, ctx)


@attrs.frozen
class TagProcessor(BaseProcessor):
    """``{"tag": "#t"}``: every note whose frontmatter or inline tags include ``#t``."""

    category = "Tags"

    @property
    def kind(self) -> str:
        return "tag"

    def parse(self, data: Mapping[str, Any]) -> TagSpec:
        return tag(_script_field("tag", data))

    def script_form(self, spec: TagSpec) -> dict[str, Any]:
        return {"tag": spec.tag}

    def from_label(
        self, label: str, lookup: LabelLookup, ctx: ProcessContext
    ) -> tuple[dict[str, Any], str]:
        _vault_for_label(ctx, "tag", label)
        return {"tag": label}, label

    def process(self, spec: TagSpec, ctx: ProcessContext) -> Processed:
        vault = _need_vault(ctx, spec.describe())
        notes = vault.notes()
        payloads: list[NotePayload] = []
        warnings: list[TurnWarning] = []
        for rel in notes:
            payload, found = _load(vault, rel, ctx.cache, ctx.notes, refresh=ctx.refresh)
            if payload.has_tag(spec.tag):
                payloads.append(payload)
                warnings.extend(found)
        if not payloads:
            raise AttachmentError(spec.describe(), "no note in the vault carries this tag")
        return _notes_processed(payloads, notes, f"tag:#{spec.tag}", warnings, vault, ctx)
