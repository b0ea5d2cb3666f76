"""Markdown chat transcripts: export a stored conversation, import one (also the plugin's).

A transcript is what a person reads in a notes app: YAML frontmatter, then per message
``**user**: ...`` / ``**ai**: ...``, a ``[Context: Notes: a.md | URLs: ...]`` line and a
``[Timestamp: ...]`` line. Import replays the turns, rebuilding attachments by running the
processors again; whatever cannot be rebuilt is listed in the ``ImportReport``.

The frontmatter carries what the next request needs to send the same bytes besides the
messages: the system prompt (``system``), and when an agent framework's adapter set L1's
mutable part, ``agent_system`` (that text is the adapter's, so another agent may replace
it) and ``agent_handoff`` (what the last requests sent after a handoff, so the next one is
explained). Usage read-backs and calibration are not carried: they are what a provider
billed for requests as they were sent, and an import builds every request again (its
attachments processed anew, under the importing host's budget), so they would describe
requests that no longer exist; the store keeps them, and a resumed conversation learns
its margin again from its own requests.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import yaml

from lamina.pipeline._conversation.conversation import Conversation, ConversationState, SystemPrompt
from lamina.pipeline._errors import ChatTranscriptError, LaminaError, NotRebuilt, StoreError
from lamina.pipeline._hashing import text_hash
from lamina.pipeline._input.safeload import LoadError, LoadLimits, load_yaml
from lamina.pipeline._model.artifacts import SourceResolver
from lamina.pipeline._model.envelope import Envelope
from lamina.pipeline._model.kinds import AttachmentKinds, LabelLookup, NoKinds
from lamina.pipeline._store.records import (
    AttachmentRecord,
    ConversationInfo,
    Head,
    Manifest,
    Store,
    TurnRecord,
    attachment_record,
    turn_record,
)
from lamina.pipeline._views.views import SegmentRenderer

__all__ = [
    "ChatMessage",
    "ChatTranscript",
    "ImportProblem",
    "ImportReport",
    "export_transcript",
    "import_transcript",
    "parse_transcript",
    "render_transcript",
]

_MARKER = re.compile(r"^\*\*(user|ai)\*\*:(?: |$)")
_CONTEXT = re.compile(r"^\[Context: (.*)\]$")
_TIMESTAMP = re.compile(r"^\[Timestamp: (.*)\]$")
# Message lines that would read as structure get one more leading backslash on export.
_STRUCTURAL = re.compile(r"^\\*(?:\*\*(?:user|ai)\*\*:|\[Context: |\[Timestamp: )")


@attrs.frozen
class ChatMessage:
    """One transcript message; ``context`` lists (kind, label) pairs as the line shows them."""

    role: str  # "user" | "ai"
    text: str
    context: tuple[tuple[str, str], ...] = ()
    timestamp: str = ""
    line: int = attrs.field(default=0, eq=False)  # where it starts in the file


@attrs.frozen
class ChatTranscript:
    """A parsed transcript: the header fields Lamina knows and the messages."""

    conversation_id: str = ""
    model: str = ""
    created: str = ""
    tags: tuple[str, ...] = ()
    title: str = ""
    system: SystemPrompt = attrs.field(factory=SystemPrompt)
    messages: tuple[ChatMessage, ...] = ()
    agent_system: str = ""
    """L1's mutable text an agent framework's adapter set (``Conversation.agent_system``)."""
    agent_handoff: str = ""
    """What the last requests sent after a handoff (``Conversation.agent_handoff``)."""


@attrs.frozen
class ImportProblem:
    """Something in a transcript that could not be rebuilt, and why."""

    turn: int  # 0 when the message did not become a turn
    kind: str
    label: str
    reason: str

    def __str__(self) -> str:
        where = f"turn {self.turn}" if self.turn else "not imported"
        return f"{where}: {self.kind} {self.label}: {self.reason}"


@attrs.frozen
class ImportReport:
    """What an import did: the conversation id, turns made, rebuilt items and problems."""

    conversation_id: str
    turns: int
    rebuilt: tuple[str, ...] = ()
    problems: tuple[ImportProblem, ...] = ()

    @property
    def complete(self) -> bool:
        return not self.problems


# --- export -----------------------------------------------------------------------------


def _escape(text: str) -> str:
    return "\n".join("\\" + ln if _STRUCTURAL.match(ln) else ln for ln in text.split("\n"))


def _unescape(line: str) -> str:
    return line[1:] if _STRUCTURAL.match(line) and line.startswith("\\") else line


def _context_line(context: Sequence[tuple[str, str]], kinds: AttachmentKinds) -> str:
    """``[Context: Notes: a.md | URLs: ...]``: each kind's category, in the kinds' order."""
    groups: dict[str, list[str]] = {}
    for kind, label in context:
        groups.setdefault(kind, []).append(label)
    parts = [
        f"{kinds.category(kind)}: {', '.join(labels)}"
        for kind, labels in sorted(groups.items(), key=lambda kv: kinds.order(kv[0]))
    ]
    return f"[Context: {' | '.join(parts)}]"


def render_transcript(transcript: ChatTranscript, kinds: AttachmentKinds | None = None) -> str:
    """The markdown text; the same transcript always gives the same bytes.

    ``kinds`` (e.g. a ``lamina.processors.Registry``) names each kind's context-line category;
    without it a category is the kind's own name (``lamina.render_transcript`` fills it).
    """
    kinds = kinds or NoKinds()
    tags, settings = _split_settings(transcript.tags)
    header: dict[str, Any] = {
        "conversation_id": transcript.conversation_id,
        "model": transcript.model,
        "created": transcript.created,
        "tags": tags,
    }
    if settings:
        header["settings"] = settings
    if transcript.title:
        header["title"] = transcript.title
    if transcript.system != SystemPrompt():
        header["system"] = {
            "stable": transcript.system.stable,
            "mutable": transcript.system.mutable,
        }
    if transcript.agent_system:
        header["agent_system"] = transcript.agent_system
    if transcript.agent_handoff:
        header["agent_handoff"] = transcript.agent_handoff
    front = yaml.safe_dump(header, sort_keys=False, allow_unicode=True, width=1_000_000)
    blocks = []
    for m in transcript.messages:
        lines = [f"**{m.role}**: {_escape(m.text)}"]
        if m.context:
            lines.append(_context_line(m.context, kinds))
        if m.timestamp:
            lines.append(f"[Timestamp: {m.timestamp}]")
        blocks.append("\n".join(lines))
    return f"---\n{front}---\n\n" + "\n\n".join(blocks) + "\n"


def _record_context(attachments: Sequence[AttachmentRecord]) -> tuple[tuple[str, str], ...]:
    return tuple((a.kind, a.label) for a in attachments)


def export_transcript(
    store: Store, conversation_id: str, kinds: AttachmentKinds | None = None
) -> str:
    """The stored conversation as markdown (deterministic given the store and ``kinds``)."""
    info = store.conversation(conversation_id)
    records = store.turns(conversation_id)
    state = store.load(conversation_id) if records else ConversationState(SystemPrompt())
    messages: list[ChatMessage] = []
    for r in records:
        messages.append(ChatMessage("user", r.user, _record_context(r.attachments), r.created))
        if r.reply is not None:
            messages.append(ChatMessage("ai", r.reply, (), r.reply_created))
    transcript = ChatTranscript(
        info.id, info.model, info.created, info.tags, info.title, state.system,
        tuple(messages), state.agent_system, state.agent_handoff,
    )  # fmt: skip
    return render_transcript(transcript, kinds)


# --- parse ------------------------------------------------------------------------------


def _scalar(value: Any) -> str:
    return value if isinstance(value, str) else "" if value is None else str(value)


_FRONTMATTER_LIMITS = LoadLimits(max_chars=1_000_000, max_depth=16, max_nodes=50_000)


def _frontmatter(lines: list[str], path: str) -> tuple[dict[str, Any], int]:
    if not lines or lines[0].rstrip() != "---":
        return {}, 0
    for end in range(1, len(lines)):
        if lines[end].rstrip() in ("---", "..."):
            break
    else:
        raise ChatTranscriptError(path, 1, "frontmatter is not closed by '---'")
    try:
        # Strings only: timestamps and epochs stay verbatim.
        data = load_yaml("\n".join(lines[1:end]), _FRONTMATTER_LIMITS, strings=True)
    except LoadError as exc:
        line = exc.line + 1 if exc.line else 1
        problem = f"malformed YAML frontmatter: {exc.problem}"
        raise ChatTranscriptError(path, line, problem) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ChatTranscriptError(path, 2, "frontmatter must be a mapping")
    return data, end + 1


def _created(meta: Mapping[str, Any], path: str) -> str:
    if "created" in meta:
        return _scalar(meta["created"])
    epoch = _scalar(meta.get("epoch"))
    if epoch.isascii() and epoch.isdigit():  # the plugin's epoch milliseconds
        try:
            if len(epoch) > 16:  # past year 300,000: not a time, and too big to convert
                raise OverflowError
            stamp = datetime.datetime.fromtimestamp(int(epoch) / 1000, tz=datetime.UTC)
        except (OverflowError, OSError, ValueError):
            shown = epoch if len(epoch) <= 24 else f"{epoch[:20]}... ({len(epoch)} digits)"
            raise ChatTranscriptError(
                path, 0, f"frontmatter 'epoch' {shown} is not a time in milliseconds"
            ) from None
        return stamp.strftime("%Y-%m-%dT%H:%M:%SZ")
    return epoch


def _tags(value: Any) -> tuple[str, ...]:
    if isinstance(value, list):
        return tuple(_scalar(v) for v in value if _scalar(v))
    text = _scalar(value)
    return tuple(t.strip() for t in text.split(",") if t.strip())


# A tag an application keeps its settings in: ``name:{JSON object}`` (``lamina serve``
# keeps a conversation's creation body as ``lamina-serve:{...}``).
_SETTINGS_TAG = re.compile(r"([a-z][a-z0-9-]*):(\{.*\})", re.DOTALL)


def _split_settings(tags: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """The tags a person gave, and the settings tags as a ``settings:`` header mapping
    (application name -> its settings' JSON text, kept as written so they read back
    exactly), where a reader looks for them."""
    plain: list[str] = []
    settings: dict[str, str] = {}
    for tag in tags:
        found = _SETTINGS_TAG.fullmatch(tag)
        if found is None or found.group(1) in settings:
            plain.append(tag)
        else:
            settings[found.group(1)] = found.group(2)
    return plain, settings


def _settings_tags(value: Any) -> tuple[str, ...]:
    """A ``settings:`` header mapping back into the tags it was kept in."""
    if not isinstance(value, Mapping):
        return ()
    tags = (f"{_scalar(name)}:{_scalar(text)}" for name, text in value.items())
    return tuple(tag for tag in tags if _SETTINGS_TAG.fullmatch(tag))


def _system(value: Any, path: str) -> SystemPrompt:
    if value is None:
        return SystemPrompt()
    if isinstance(value, str):
        return SystemPrompt(value)
    if isinstance(value, dict):
        return SystemPrompt(_scalar(value.get("stable")), _scalar(value.get("mutable")))
    raise ChatTranscriptError(path, 0, "frontmatter 'system' must be text or stable/mutable")


def _parse_context(inner: str, kinds: AttachmentKinds) -> tuple[tuple[str, str], ...]:
    out: list[tuple[str, str]] = []
    for part in inner.split(" | "):
        name, sep, rest = part.partition(":")
        if not sep:
            out.append(("unknown", part.strip()))
            continue
        kind = kinds.kind_named(name.strip())
        out.extend((kind, item.strip()) for item in rest.split(", ") if item.strip())
    return tuple(out)


def _lines(text: str) -> list[str]:
    """The file's lines. A file whose first line ends in CRLF was saved with CRLF line ends
    (an editor on Windows); otherwise a CR belongs to a message and is kept."""
    first = text.find("\n")
    if first > 0 and text[first - 1] == "\r":
        text = text.replace("\r\n", "\n")
    return text.split("\n")


def parse_transcript(
    text: str, path: str = "<transcript>", kinds: AttachmentKinds | None = None
) -> ChatTranscript:
    """Read a Lamina or original-plugin transcript; ChatTranscriptError if malformed.

    ``kinds`` maps context-line categories (``Notes``) to kinds; without it a category is
    read as a kind's name (``lamina.parse_transcript`` fills it).
    """
    kinds = kinds or NoKinds()
    lines = _lines(text)
    meta, start = _frontmatter(lines, path)
    messages: list[ChatMessage] = []
    current: tuple[str, int, list[str]] | None = None

    def finish() -> None:
        if current is None:
            return
        role, line, body = current
        while body and not body[-1].strip():
            body.pop()
        timestamp = ""
        context: tuple[tuple[str, str], ...] = ()
        for _ in range(2):
            if body and (m := _TIMESTAMP.match(body[-1])) and not timestamp:
                timestamp = m.group(1)
                body.pop()
            elif body and (m := _CONTEXT.match(body[-1])) and not context:
                context = _parse_context(m.group(1), kinds)
                body.pop()
        messages.append(
            ChatMessage(role, "\n".join(_unescape(b) for b in body), context, timestamp, line)
        )

    for number, line in enumerate(lines[start:], start=start + 1):
        m = _MARKER.match(line)
        if m:
            finish()
            current = (m.group(1), number, [line[m.end() :]])
        elif current is not None:
            current[2].append(line)
        elif line.strip():
            raise ChatTranscriptError(
                path, number, "text before the first **user**: or **ai**: message"
            )
    finish()
    return ChatTranscript(
        conversation_id=_scalar(meta.get("conversation_id")),
        model=_scalar(meta.get("model", meta.get("modelKey"))),
        created=_created(meta, path),
        tags=_tags(meta.get("tags")) + _settings_tags(meta.get("settings")),
        title=_scalar(meta.get("title", meta.get("topic"))),
        system=_system(meta.get("system"), path),
        messages=tuple(messages),
        agent_system=_scalar(meta.get("agent_system")),
        agent_handoff=_scalar(meta.get("agent_handoff")),
    )


# --- import -----------------------------------------------------------------------------


def _attempt(
    conv: Conversation, kinds: AttachmentKinds, kind: str, label: str, lookup: LabelLookup
) -> tuple[dict[str, Any] | None, str, str]:
    """(script form, label to keep, reason it failed): the kind's processor rebuilds the
    form from the label, and the form is then checked by processing it."""
    try:
        form, label = kinds.from_label(kind, label, lookup)
    except NotRebuilt as exc:
        return None, label, exc.reason
    try:
        conv.process(form)
    except LaminaError as exc:
        return None, label, str(exc)
    return form, label, ""


def import_transcript(
    text: str,
    store: Store,
    *,
    sources: SourceResolver | None = None,
    renderer: SegmentRenderer | None = None,
    allow_fetch: bool = False,
    conversation_id: str | None = None,
    path: str = "<transcript>",
) -> ImportReport:
    """Replay a transcript into ``store`` as a new conversation; report what did not rebuild.

    Notes are found in the vault by path, else by a unique basename; URLs and videos are
    fetched only with ``allow_fetch``; selections only if the store kept their text.
    The whole import is one transaction, written once every turn is rebuilt: a failure
    or a kill leaves nothing behind, so importing again works.
    """
    kinds = sources.kinds if sources is not None else NoKinds()
    parsed = parse_transcript(text, path, kinds)
    cid = conversation_id or parsed.conversation_id or text_hash(text)
    conv = Conversation(parsed.system, sources=sources, renderer=renderer)
    conv.agent_system = parsed.agent_system
    conv.summaries.backing = store
    lookup = LabelLookup(allow_fetch, lambda kind, label: _stored(store, kind, label))
    saves: list[tuple[TurnRecord, ConversationState, Manifest, Any]] = []

    def keep(envelope: Envelope, records: list[AttachmentRecord], created: str, reply: str) -> None:
        """The turn as it stands now; a reply replaces the turn's earlier version."""
        record = turn_record(conv, records, created=created, reply_created=reply)
        if saves and saves[-1][0].turn == record.turn:
            saves.pop()
        summaries = conv.summaries.unsaved()
        conv.summaries.mark_saved(key for key, _ in summaries)
        saves.append((record, conv.state, Manifest.of(envelope), summaries))
    problems: list[ImportProblem] = []
    rebuilt: list[str] = []
    last: tuple[Envelope, list[AttachmentRecord], str] | None = None
    for m in parsed.messages:
        if m.role == "ai":
            if last is None or conv.history[-1].assistant is not None:
                problems.append(
                    ImportProblem(
                        0,
                        "message",
                        f"line {m.line}",
                        "an ai message with no user message before it",
                    )
                )
                continue
            conv.reply(m.text)
            envelope, records, created = last
            keep(envelope, records, created, m.timestamp)
            continue
        turn = len(conv.history) + 1
        forms: list[dict[str, Any]] = []
        records = []
        for kind, label in m.context:
            form, kept, why = _attempt(conv, kinds, kind, label, lookup)
            if form is None:
                problems.append(ImportProblem(turn, kind, label, why))
                records.append(AttachmentRecord(kind, kept, "", rebuilt=False))
            else:
                forms.append(form)
                rebuilt.append(f"{kind} {kept}")
                records.append(attrs.evolve(attachment_record(form, conv), label=kept))
        try:
            envelope = conv.turn(m.text, forms)
        except LaminaError as exc:
            raise StoreError(store.path, f"importing {path} turn {turn}: {exc}") from None
        keep(envelope, records, m.timestamp, "")
        last = (envelope, records, m.timestamp)
    if saves and parsed.agent_handoff:  # what the last turn's requests sent, as saved
        record, state, manifest, summaries = saves[-1]
        state = attrs.evolve(state, agent_handoff=parsed.agent_handoff)
        saves[-1] = (record, state, manifest, summaries)
    with store.transaction():
        store.create(
            ConversationInfo(cid, parsed.created, parsed.model, parsed.tags, parsed.title)
        )
        head = Head()
        for record, state, manifest, summaries in saves:
            head = store.save_turn(cid, record, state, manifest, summaries, parent=head)
    return ImportReport(cid, len(conv.history), tuple(rebuilt), tuple(problems))


def _stored(store: Store, kind: str, label: str) -> dict[str, Any] | None:
    """The script form ``store`` kept for an attachment of ``kind`` labelled ``label``."""
    found = store.find_attachment(kind, label)
    return None if found is None else found.data()
