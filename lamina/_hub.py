"""The server's conversations: warm in a bounded LRU, every turn saved before it is answered.

Everything here is synchronous and runs in worker threads; the app (``_server``) holds one
lock per conversation, so a ``_Warm`` is only ever used by one thread at a time.
"""

from __future__ import annotations

import json
import os
import secrets
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
from pydantic import BaseModel

import lamina.pipeline as pipeline
from lamina._api_models import ConversationCreate, ReplyIn, TurnIn
from lamina._budgets import NeedsWindow, budget_of
from lamina._host import Conversation, export_transcript, load_conversation, rebuild_envelope
from lamina.pipeline import AttachmentSpec, Budget, Envelope, LaminaError, Policy, SystemPrompt
from lamina.pipeline.errors import AttachmentError, ConfigError, ConversationError
from lamina.pipeline.store import (
    AttachmentRecord,
    ConversationInfo,
    Head,
    Store,
    attachment_record,
    open_store,
    save_turn,
)
from lamina.pipeline.tools import tool, tool_turn
from lamina.processors import ProcessContext, Sources, Vault
from lamina.renderers import (
    PREVIOUS_NOT_REBUILT,
    explain_cache,
    prefix_report,
    render_request,
    trace_turn,
)

__all__ = ["ConversationHub", "FieldError", "ServerConfig", "StaleHead"]

# The creation settings ride along in the conversation header's tags, so a restarted
# server (or another worker) rebuilds the conversation exactly.
_SETTINGS_TAG = "lamina-serve:"


def _names(values: Iterable[str]) -> tuple[str, ...]:
    return tuple(values)


@attrs.frozen
class ServerConfig:
    """What ``lamina serve`` was started with; every cap is in bytes of UTF-8 text."""

    store: str = "lamina.sqlite"
    vault: Path | None = None
    token: str | None = None
    allow_private_network: bool = False
    max_body_bytes: int = 8 * 1024 * 1024
    max_text_bytes: int = 1024 * 1024
    url_timeout: float = 10.0
    url_max_bytes: int = 5_000_000
    warm: int = 64
    threads: int = 16
    # Turns that fetch URLs run in their own pool of this many threads, so slow pages
    # never hold the threads other conversations' turns need.
    fetch_threads: int = 8
    # Without a token, the Host names (and Origins) a request may use besides the bound
    # address, localhost, 127.0.0.1 and ::1 (a DNS-rebound page uses its own name).
    allowed_hosts: tuple[str, ...] = attrs.field(default=(), converter=_names)
    # A connection must send its request head within header_timeout seconds and its body
    # within body_timeout, and read what it is sent: an answer that makes no progress
    # towards the client for write_timeout seconds closes it (nginx's send_timeout); at
    # most max_connections are open (0: half the descriptor limit).
    header_timeout: float = 10.0
    body_timeout: float = 60.0
    write_timeout: float = 30.0
    max_connections: int = 0
    # The HTTP/1.1 parser: "httptools" (the server extra's; about a third of h11's cost a
    # request), "h11", or "auto" (httptools when installed).
    http: str = "auto"
    # Freeze what start-up made (modules, the app, the hub) out of the garbage collector's
    # reach when the app starts: ``serve`` sets it for its own process; an app embedded in
    # a host's process leaves the host's collector alone.
    freeze_gc: bool = False


# `lamina serve --workers N` hands its settings to each worker process through this.
CONFIG_ENV = "LAMINA_SERVE_CONFIG"


def config_from_env() -> ServerConfig:
    """The settings a ``--workers N`` parent handed its children (``CONFIG_ENV``)."""
    raw = json.loads(os.environ[CONFIG_ENV])
    vault = raw.pop("vault")
    return ServerConfig(vault=None if vault is None else Path(vault), **raw)


class FieldError(LaminaError):
    """A request value Lamina refuses, named by its field (answered with ``status``)."""

    def __init__(self, field: str, problem: str, status: int = 422) -> None:
        self.field = field
        self.status = status
        super().__init__(problem)


class StaleHead(LaminaError):
    """The request continues a head that is not the conversation's head (409)."""

    def __init__(self, head: Head) -> None:
        self.head = head
        super().__init__(
            f"the conversation is at turn {head.turn}: this request continues another head; "
            "fetch the conversation and build on its head"
        )


@attrs.define
class _Warm:
    """One conversation in memory: the live ``Conversation`` and what it built so far."""

    conv: pipeline.Conversation
    settings: ConversationCreate
    sources: Sources
    envelopes: dict[int, Envelope] = attrs.field(factory=dict)
    attached: dict[int, tuple[AttachmentRecord, ...]] = attrs.field(factory=dict)

    @property
    def head(self) -> Head:
        return self.conv.saved_head or Head()


class ConversationHub:
    """Creates, loads, builds and saves conversations for the HTTP API."""

    def __init__(self, config: ServerConfig, store: Store | None = None) -> None:
        self.config = config
        self.store: Store = store if store is not None else open_store(config.store)
        self._warm: OrderedDict[str, _Warm] = OrderedDict()
        self._mutex = threading.Lock()
        # Client-only conversations overlay their notes on an empty folder.
        self._empty = tempfile.TemporaryDirectory(prefix="lamina-serve-")
        # The server's own folders, which its answers never name (longest first).
        folders = (
            [Path(self._empty.name)]
            if config.vault is None
            else [
                config.vault,
                Path(self._empty.name),
            ]
        )
        names = {str(p) for f in folders for p in (f, f.absolute(), f.resolve())}
        self.roots = tuple(sorted(names, key=len, reverse=True))

    def close(self) -> None:
        self.store.close()
        self._empty.cleanup()

    # -- conversations ----------------------------------------------------------------

    def create(self, body: ConversationCreate) -> tuple[str, Head]:
        _check_text(body)
        budget = _budget(body)
        conversation_id = secrets.token_hex(16)
        settings = body.model_dump_json(exclude_defaults=True)
        info = ConversationInfo(
            conversation_id,
            now_stamp(),
            model=body.model or "",
            tags=(_SETTINGS_TAG + settings,),
            title=body.title,
            vault=str(self._root(body)),
        )
        sources = self._sources(body)
        conv = Conversation(
            _system(body),
            sources=sources,
            tokenizer=body.tokenizer,
            policy=Policy(freshness=body.policy.freshness, reattach=body.policy.reattach),
            budget=budget,
            defer_library=body.defer_library,
        )
        self.store.create(info)
        self._keep(conversation_id, _Warm(conv, body, sources))
        return conversation_id, Head()

    def info(self, conversation_id: str) -> tuple[ConversationInfo, ConversationCreate, Head]:
        info = self.store.conversation(conversation_id)
        return info, _settings(info), self.store.head(conversation_id)

    def all(self) -> list[tuple[ConversationInfo, ConversationCreate, Head]]:
        return [
            (info, _settings(info), self.store.head(info.id)) for info in self.store.conversations()
        ]

    def delete(self, conversation_id: str) -> None:
        self.store.delete(conversation_id)
        self._drop(conversation_id)

    def transcript(self, conversation_id: str) -> str:
        return export_transcript(self.store, conversation_id)

    # -- turns ------------------------------------------------------------------------

    def turn(self, conversation_id: str, body: TurnIn) -> tuple[dict[str, Any], Head]:
        """Build the next turn on ``body.parent``, save it, and return its trace turn."""
        _check_text(body)
        parent = Head(body.parent.turn, body.parent.hash)
        warm = self._current(conversation_id, parent)
        changes = self._changes(body)
        specs = self._specs(warm, body.attach)
        tools = [tool(c.name, c.args, c.result) for c in body.tools]
        conv = warm.conv
        previous = self._previous(conversation_id, warm, parent.turn)
        try:
            envelope = tool_turn(conv, body.user, specs, tools=tools, vault_changes=changes)
        except AttachmentError as exc:  # named by the field of the attachment it names
            named = [
                i
                for i, spec in enumerate(specs)
                if spec.describe() in (exc.spec, f"{spec.kind} {exc.spec}")
            ]
            if not named:
                raise
            raise FieldError(f"attach[{named[0]}]", str(exc)) from None
        records = tuple(attachment_record(a, conv) for a in body.attach)
        try:
            save_turn(self.store, conversation_id, conv, envelope, records, parent=parent)
        except BaseException:
            self._drop(conversation_id)  # built but not saved: the state is not the store's
            raise
        warm.envelopes[envelope.turn] = envelope
        warm.attached[envelope.turn] = records
        out = self._trace(conversation_id, warm, envelope, previous)
        if previous is None and parent.turn:  # not the first request: say what is unknown
            out["cache"]["break_reason"] = PREVIOUS_NOT_REBUILT
            out["cache"]["sentence"] = " ".join(explain_cache(out))
        return out, warm.head

    def reply(self, conversation_id: str, body: ReplyIn) -> Head:
        """Record the answer to the last turn and save that turn again with it."""
        _check_text(body)
        parent = Head(body.parent.turn, body.parent.hash)
        warm = self._current(conversation_id, parent)
        k = parent.turn
        if k == 0:
            raise FieldError("text", "the conversation has no turn to reply to", 409)
        envelope = self._envelope(conversation_id, warm, k)
        records = warm.attached.get(k)
        if records is None:
            records = self.store.turns(conversation_id)[k - 1].attachments
        try:
            warm.conv.reply(body.text)
        except ConversationError as exc:
            raise FieldError("text", str(exc), 409) from None
        try:
            save_turn(self.store, conversation_id, warm.conv, envelope, records, parent=parent)
        except BaseException:
            self._drop(conversation_id)
            raise
        return warm.head

    def trace(self, conversation_id: str, k: int) -> tuple[dict[str, Any], Head]:
        """Turn ``k``'s trace turn, rebuilt from the store when it is not in memory."""
        warm = self._current(conversation_id)
        if not 1 <= k <= warm.head.turn:
            raise _no_turn(k, warm.head)
        envelope = self._envelope(conversation_id, warm, k)
        previous = self._envelope(conversation_id, warm, k - 1) if k > 1 else None
        return self._trace(conversation_id, warm, envelope, previous), warm.head

    def trace_document(self, conversation_id: str) -> dict[str, Any]:
        """The whole conversation as ``lamina run --json --store`` prints it."""
        warm = self._current(conversation_id)
        turns = []
        previous = None
        for k in range(1, warm.head.turn + 1):
            envelope = self._envelope(conversation_id, warm, k)
            turns.append(self._trace(conversation_id, warm, envelope, previous))
            previous = envelope
        return {
            "conversation_id": conversation_id,
            "lamina_trace": 1,
            "tokenizer": warm.conv.counter.name,
            "turns": turns,
        }

    def request(
        self, conversation_id: str, k: int, provider: str | None, layout: str | None
    ) -> dict[str, Any]:
        warm = self._current(conversation_id)
        if not 1 <= k <= warm.head.turn:
            raise _no_turn(k, warm.head)
        chosen = provider or warm.settings.provider or "openai"
        return self._request(conversation_id, warm, k, chosen, layout or warm.settings.layout)

    # -- plumbing ---------------------------------------------------------------------

    def _trace(
        self,
        conversation_id: str,
        warm: _Warm,
        envelope: Envelope,
        previous: Envelope | None,
    ) -> dict[str, Any]:
        counter = warm.conv.counter
        out = trace_turn(envelope, counter)
        out["cache"] = prefix_report(previous, envelope, counter).trace()
        before = None if previous is None else trace_turn(previous, counter)
        out["cache"]["sentence"] = " ".join(explain_cache(out, before))
        provider = warm.settings.provider
        if provider is not None:
            out["request"] = self._request(
                conversation_id, warm, envelope.turn, provider, warm.settings.layout
            )
        return out

    def _request(
        self, conversation_id: str, warm: _Warm, k: int, provider: str, layout: str
    ) -> dict[str, Any]:
        first = 1 if layout != "default" else k
        envelopes = [self._envelope(conversation_id, warm, i) for i in range(first, k + 1)]
        rendered = render_request(
            envelopes,
            provider,
            warm.settings.model,
            layout=layout,  # type: ignore[arg-type]
            counter=warm.conv.counter,
            conversation_id=conversation_id,
        )
        return rendered.body

    def _envelope(self, conversation_id: str, warm: _Warm, k: int) -> Envelope:
        envelope = warm.envelopes.get(k)
        if envelope is None:
            # As it was sent: a turn an older Lamina saved is told from its stored manifest.
            envelope = rebuild_envelope(
                self.store, conversation_id, k, sources=warm.sources, as_sent=True
            )
            if envelope is None:
                raise FieldError(
                    "turn",
                    f"turn {k} cannot be rebuilt as it was sent (its sources changed or were "
                    "not kept)",
                    409,
                )
            warm.envelopes[k] = envelope
        return envelope

    def _previous(self, conversation_id: str, warm: _Warm, k: int) -> Envelope | None:
        """Turn ``k``'s envelope for the next turn's cache report; None when there is no
        turn ``k`` or it cannot be rebuilt as it was sent (a changed page, tool results not
        kept), so a turn after a restart is still built, its cache report saying the
        previous request is not known (``PREVIOUS_NOT_REBUILT``)."""
        if k == 0:
            return None
        try:
            return self._envelope(conversation_id, warm, k)
        except FieldError:
            return None

    def _current(self, conversation_id: str, parent: Head | None = None) -> _Warm:
        """The warm conversation: at the store's head, or with ``parent`` (the head a
        request names) at exactly that head, else StaleHead with the store's head.

        A request is never built on a head it did not name: a warm copy at another head is
        reloaded at ``parent`` itself (not at whatever head the store holds by then), and the
        save checks ``parent`` again, so a newer head can only mean 409."""
        with self._mutex:
            warm = self._warm.get(conversation_id)
            if warm is not None:
                self._warm.move_to_end(conversation_id)
        if parent is not None and warm is not None and warm.head == parent:
            return warm  # the save's own check refuses it if the store moved on meanwhile
        head = self.store.head(conversation_id)
        if parent is not None and head != parent:
            raise StaleHead(head)
        if warm is None or warm.head != head:
            warm = self._load(conversation_id, head)
            if warm.head != head:  # another writer moved on between the two reads
                self._drop(conversation_id)
                raise StaleHead(warm.head)
        return warm

    def _load(self, conversation_id: str, head: Head) -> _Warm:
        """The conversation at ``head`` exactly (its turn; the hash is checked by callers)."""
        info = self.store.conversation(conversation_id)
        settings = _settings(info)
        sources = self._sources(settings)
        conv: pipeline.Conversation
        if head.turn == 0:
            conv = Conversation(
                _system(settings),
                sources=sources,
                tokenizer=settings.tokenizer,
                policy=Policy(
                    freshness=settings.policy.freshness, reattach=settings.policy.reattach
                ),
                budget=_budget(settings),
                defer_library=settings.defer_library,
            )
            conv.saved_head = Head()
        else:
            conv = load_conversation(self.store, conversation_id, turn=head.turn, sources=sources)
        warm = _Warm(conv, settings, sources)
        self._keep(conversation_id, warm)
        return warm

    def _keep(self, conversation_id: str, warm: _Warm) -> None:
        with self._mutex:
            self._warm[conversation_id] = warm
            self._warm.move_to_end(conversation_id)
            while len(self._warm) > self.config.warm:
                self._warm.popitem(last=False)

    def _drop(self, conversation_id: str) -> None:
        with self._mutex:
            self._warm.pop(conversation_id, None)

    def _root(self, settings: ConversationCreate) -> Path:
        if settings.vault and self.config.vault is not None:
            return self.config.vault
        return Path(self._empty.name)

    def _sources(self, settings: ConversationCreate) -> Sources:
        """The conversation's sources: the server's vault (or an empty one for client-only
        notes), the SSRF guard as in the CLI, and the server's URL caps."""
        context = ProcessContext(
            vault=Vault(self._root(settings)),
            allow_private_network=self.config.allow_private_network,
            options={
                "url_timeout": self.config.url_timeout,
                "url_max_bytes": self.config.url_max_bytes,
            },
        )
        return Sources(context=context)

    def _changes(self, body: TurnIn) -> dict[str, str]:
        """Vault changes and client notes, one overlay: a sent note is a vault note."""
        cap = self.config.max_text_bytes
        changes: dict[str, str] = {}
        for path, text in body.vault_changes.items():
            _cap(f"vault_changes.{path}", text, cap)
            changes[path] = text
        for i, note in enumerate(body.notes):
            _cap(f"notes[{i}].content", note.content, cap)
            changes[note.path] = note.content
        return changes

    def _specs(self, warm: _Warm, attach: Sequence[Mapping[str, Any]]) -> list[AttachmentSpec]:
        specs = []
        for i, raw in enumerate(attach):
            _cap(f"attach[{i}]", json.dumps(raw, ensure_ascii=False), self.config.max_text_bytes)
            try:
                specs.append(warm.conv.sources.parse(raw))
            except LaminaError as exc:
                raise FieldError(f"attach[{i}]", str(exc)) from None
        return specs


def _check_text(value: Any, field: str = "") -> None:
    """FieldError (422) for the first string in a request that is not Unicode text: JSON
    may spell a lone surrogate (``"\\ud800"``), which no store or response can encode."""
    if isinstance(value, str):
        if not value.isascii():
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise FieldError(field or "body", _SURROGATE) from None
    elif isinstance(value, BaseModel):
        for name in type(value).model_fields:
            _check_text(getattr(value, name), f"{field}.{name}" if field else name)
    elif isinstance(value, Mapping):
        for key, item in value.items():
            _check_text(key, field)
            _check_text(item, f"{field}.{key}" if field else str(key))
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            _check_text(item, f"{field}[{i}]")


_SURROGATE = "holds a lone surrogate (\\ud800-\\udfff), which is not Unicode text"


def _no_turn(k: int, head: Head) -> FieldError:
    return FieldError("turn", f"there is no turn {k} (the head is turn {head.turn})", 404)


def _cap(field: str, text: str, cap: int) -> None:
    if len(text.encode("utf-8", "surrogatepass")) > cap:
        raise FieldError(field, f"is larger than the server's limit of {cap} bytes", 413)


def _system(settings: ConversationCreate) -> SystemPrompt:
    system = settings.system
    if isinstance(system, str):
        return SystemPrompt(system)
    return SystemPrompt(system.stable, system.mutable)


def _settings(info: ConversationInfo) -> ConversationCreate:
    for tag in info.tags:
        if tag.startswith(_SETTINGS_TAG):
            return ConversationCreate.model_validate_json(tag.removeprefix(_SETTINGS_TAG))
    # A conversation saved by `lamina run --store`: the saved state carries the rest.
    return ConversationCreate(vault=bool(info.vault))


def _budget(settings: ConversationCreate) -> Budget | None:
    """The CLI's budget rule (``budget_of``) on a conversation's settings, its errors named
    by the request's field (``objective.<field>`` for the objective's settings)."""
    model = settings.model
    try:
        return budget_of(
            settings.window, settings.reserve, model, settings.recall, settings.objective
        )
    except NeedsWindow as exc:
        raise FieldError(exc.setting, "needs a window or a model") from None
    except ConfigError as exc:
        if exc.setting.startswith("objective"):
            raise FieldError(exc.setting, str(exc)) from None
        name = exc.setting.removeprefix("budget.")
        field = _BUDGET_FIELDS.get(name, "model" if model is not None else "window")
        problem = str(exc).removeprefix(f"{exc.setting}: ")
        raise FieldError(field, f"{field}: {problem}") from None


# The budget's settings a request sets, by the request field that sets them; any other
# budget setting comes from the model's profile (with a model) or the window.
_BUDGET_FIELDS = {"context_window": "window", "reserve_output": "reserve", "recall": "recall"}


def now_stamp() -> str:
    """The wall-clock time for humans (the store's format); never hashed or rendered."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
