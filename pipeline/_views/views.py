"""Views of an artifact in each form, and the carry-forward form L2 keeps."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar, cast

import attrs

from lamina.pipeline._errors import ArgumentError, ConfigError
from lamina.pipeline._hashing import text_hash
from lamina.pipeline._model.artifacts import Artifact
from lamina.pipeline._model.envelope import Form, View
from lamina.pipeline._tokens.counter import (
    TokenCounter,
    count_joined_from,
    count_with_sep_from,
    starts_piece,
)
from lamina.pipeline._views.summarize import Summarizer, SummaryCache

if TYPE_CHECKING:
    from lamina.pipeline._views.preview import Preview

T = TypeVar("T")

__all__ = [
    "Policy",
    "SegmentRenderer",
    "ViewMemo",
    "carry_forward",
    "excerpt_view",
    "full_view",
    "learn_rendering",
    "preview_view",
    "reference_view",
    "renderer_memo",
    "shared_views",
    "summary_view",
]

Freshness = Literal["pin", "refresh"]
Reattach = Literal["full", "reference"]


def _positive(_: object, attribute: attrs.Attribute[int], value: int) -> None:
    if value < 1:
        raise ConfigError(f"policy.{attribute.name}", f"must be a positive number, got {value}")


@attrs.frozen
class Policy:
    """How artifacts move between layers.

    ``freshness`` decides what happens when an artifact already in L2 comes back with new
    content. The default, ``pin``, leaves the L2 bytes alone so the cached prefix survives,
    and sends the new version in full in L3 marked ``newer``; ``refresh`` replaces the L2
    entry in place (last write wins) and reports the prefix break. Pin is the default
    because a refresh invalidates every cached token after the entry (the rest of the
    library and all history), while a pin costs only the changed item, only in turns
    that attach it.

    ``reattach`` decides what L3 carries when the user attaches again an item that L2
    holds only shortened (preview/excerpt): ``full`` (default) re-sends it in full, since a
    bare reference would leave the model with the preview alone; ``reference`` saves tokens.

    Carry-forward: an item whose full rendering (its block, tag included) has at most
    ``verbatim_tokens`` tokens enters L2 verbatim (1,300: about the original's 5,000
    characters plus the tag); a larger recoverable one becomes a structure + preview
    (``section_tokens`` per section, ``max_sections`` sections, ``headless_tokens`` when it
    has no headings); a larger non-recoverable one an excerpt of ``verbatim_tokens`` tokens,
    never dropped.
    """

    freshness: Freshness = attrs.field(default="pin")
    reattach: Reattach = attrs.field(default="full")
    verbatim_tokens: int = attrs.field(default=1300, validator=_positive)
    section_tokens: int = attrs.field(default=125, validator=_positive)
    max_sections: int = attrs.field(default=20, validator=_positive)
    headless_tokens: int = attrs.field(default=500, validator=_positive)

    @freshness.validator
    def _check_freshness(self, _: attrs.Attribute[str], value: str) -> None:
        if value not in ("pin", "refresh"):
            raise ConfigError("policy.freshness", f"must be 'pin' or 'refresh', got {value!r}")

    @reattach.validator
    def _check_reattach(self, _: attrs.Attribute[str], value: str) -> None:
        if value not in ("full", "reference"):
            raise ConfigError("policy.reattach", f"must be 'full' or 'reference', got {value!r}")


class SegmentRenderer(Protocol):
    """Turns a typed view into segment text (XML by default: ``lamina.renderers.XmlRenderer``)."""

    def render(self, view: View) -> str: ...


def renderer_memo(renderer: SegmentRenderer) -> ViewMemo | None:
    """The ``ViewMemo`` a renderer keeps its renderings in (its ``memo``), if it has one:
    a conversation sizes it to each turn (``reserve``) as it does the preview memo."""
    memo = getattr(renderer, "memo", None)
    return memo if isinstance(memo, ViewMemo) else None


def _view(artifact: Artifact, form: Form, body: str, marks: tuple[tuple[str, str], ...]) -> View:
    return View(
        key=artifact.key,
        source_type=artifact.source_type,
        form=form,
        title=artifact.title,
        locator=artifact.locator,
        recoverable=artifact.recoverable,
        content_hash=artifact.content_hash,
        attributes=artifact.payload.attributes(),
        body=body,
        marks=marks,
    )


def full_view(artifact: Artifact, marks: tuple[tuple[str, str], ...] = ()) -> View:
    return _view(artifact, Form.FULL, artifact.payload.body(), marks)


def reference_view(artifact: Artifact, marks: tuple[tuple[str, str], ...] = ()) -> View:
    return _view(artifact, Form.REFERENCE, "", marks)


@attrs.define
class ViewMemo:
    """A bounded memo of what was made from views, least recently used first to go.

    One per conversation keeps previews and excerpts by content hash, tokenizer and limits:
    a turn's budget loop measures the same compacted items again after every cut, and
    promotion previews what L3 just previewed. ``XmlRenderer`` keeps its renderings in one.
    ``max_chars`` (0: no bound) also bounds the characters of the texts it holds (a
    preview's or excerpt's ``text`` too), so a long-lived conversation does not keep every
    full block it ever rendered. ``reserve`` raises ``size`` to what a turn needs, up to
    ``max_size`` (0: ``size`` is fixed); ``made`` counts the entries made.
    """

    size: int = 256
    hits: int = 0
    max_chars: int = 0
    max_size: int = 0
    made: int = 0
    _items: OrderedDict[Hashable, Any] = attrs.field(factory=OrderedDict, repr=False)
    _chars: int = attrs.field(default=0, repr=False)
    # A renderer's memo may be shared by conversations, one promoting on its own thread.
    _lock: threading.Lock = attrs.field(factory=threading.Lock, repr=False, eq=False)

    def get(self, key: Hashable, make: Callable[[], T]) -> T:
        with self._lock:
            found = self._items.get(key)
            if found is not None:
                self._items.move_to_end(key)
                self.hits += 1
                return cast(T, found)
        made = make()
        with self._lock:
            if key not in self._items:
                self._items[key] = made
                self.made += 1
                self._chars += _chars_of(made)
            while len(self._items) > self.size or (
                self.max_chars and self._chars > self.max_chars and self._items
            ):
                _, old = self._items.popitem(last=False)
                self._chars -= _chars_of(old)
        return made

    def reserve(self, entries: int) -> None:
        """Room for ``entries`` (never less than now; at most ``max_size``). A turn touches
        its entries in the same order every time, so when they outnumber ``size`` least
        recently used evicts each one just before the next build asks for it: a 1,600-note
        folder turn under a 1,024-entry memo found none of its previews again."""
        with self._lock:
            self.size = max(self.size, min(self.max_size, entries))

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._chars = 0

    @property
    def chars(self) -> int:
        """Characters of the texts held now."""
        return self._chars


def _chars_of(value: object) -> int:
    """Characters of a held text: a str, or a preview's or excerpt's ``text``."""
    text = value if isinstance(value, str) else getattr(value, "text", None)
    return len(text) if isinstance(text, str) else 0


# The shared memo starts at 1,024 entries and grows to twice the entries the largest turn
# made (its own, and as many again for another conversation's turn of that size between
# two of its builds), bounded by 16,384 entries (a 6,400-note folder's turn twice over)
# and 16 million characters of preview and excerpt text, whichever binds first.
_SHARED_SIZE = 1024
_SHARED_MAX_SIZE = 16_384
_SHARED_MAX_CHARS = 16_000_000
_shared_views = ViewMemo(
    size=_SHARED_SIZE, max_size=_SHARED_MAX_SIZE, max_chars=_SHARED_MAX_CHARS
)


def shared_views() -> ViewMemo:
    """The process's memo of previews and excerpts, shared by every conversation: each is
    a pure function of the content hash, the tokenizer and the limits (its key), so a
    stateless server's next request for a conversation finds the previews it fitted. Each
    turn ``reserve``s twice the entries it made (bounds above)."""
    return _shared_views


def _policy_preview(body: str, counter: TokenCounter, policy: Policy) -> Preview:
    """``make_preview`` of ``body`` with ``policy``'s section limits."""
    from lamina.pipeline._views.preview import make_preview

    return make_preview(
        body,
        counter,
        max_sections=policy.max_sections,
        section_tokens=policy.section_tokens,
        headless_tokens=policy.headless_tokens,
    )


def _limits(policy: Policy) -> tuple[int, int, int]:
    return (policy.max_sections, policy.section_tokens, policy.headless_tokens)


def _preview(
    artifact: Artifact, counter: TokenCounter, policy: Policy, memo: ViewMemo | None
) -> Preview:
    def make() -> Preview:
        return _policy_preview(artifact.payload.body(), counter, policy)

    if memo is None:
        return make()
    return memo.get(("preview", artifact.content_hash, counter.name, *_limits(policy)), make)


def body_preview(body: str, counter: TokenCounter, policy: Policy, memo: ViewMemo) -> Preview:
    """The preview of ``body`` (``make_preview`` with ``policy``'s limits), remembered by
    the body's hash: a library entry's next form, made ahead of a budget cut or by it."""
    return memo.get(
        ("body-preview", text_hash(body), counter.name, *_limits(policy)),
        lambda: _policy_preview(body, counter, policy),
    )


def preview_view(
    artifact: Artifact,
    counter: TokenCounter,
    policy: Policy,
    marks: tuple[tuple[str, str], ...] = (),
    memo: ViewMemo | None = None,
) -> View:
    preview = _preview(artifact, counter, policy, memo)
    return _view(artifact, Form.PREVIEW, preview.text, marks)


def excerpt_view(
    artifact: Artifact,
    counter: TokenCounter,
    max_tokens: int,
    marks: tuple[tuple[str, str], ...] = (),
    memo: ViewMemo | None = None,
) -> View:
    from lamina.pipeline._views.preview import make_excerpt

    def make() -> str:
        return make_excerpt(artifact.payload.body(), counter, max_tokens).text

    key = ("excerpt", artifact.content_hash, counter.name, max_tokens)
    text = make() if memo is None else memo.get(key, make)
    return _view(artifact, Form.EXCERPT, text, marks)


def summary_view(
    artifact: Artifact,
    cache: SummaryCache,
    summarizer: Summarizer,
    target_tokens: int,
    marks: tuple[tuple[str, str], ...] = (),
) -> View:
    """A memoized abstractive-or-extractive summary; never for non-recoverable artifacts."""
    if not artifact.recoverable:
        raise ArgumentError(
            "artifact", f"{artifact.key} is not recoverable and may only be excerpted"
        )
    body = artifact.payload.body()
    result = cache.summarize(summarizer, artifact.content_hash, body, target_tokens)
    return _view(artifact, Form.SUMMARY, result.text, marks)


def carry_forward(
    artifact: Artifact,
    counter: TokenCounter,
    policy: Policy,
    renderer: SegmentRenderer,
    memo: ViewMemo | None = None,
) -> tuple[View, str]:
    """The form an artifact takes when promoted into L2 (its compaction class), and
    its text. The full rendering is usually counted already (it is what L3 sent), so
    deciding costs no encoding; a preview's rendering is counted from its sections' counts
    when the renderer keeps the preview verbatim (see ``_rendered_tokens``)."""
    view = full_view(artifact)
    text = renderer.render(view)
    if counter.count(text) <= policy.verbatim_tokens:
        return view, text
    if not artifact.recoverable:
        view = excerpt_view(artifact, counter, policy.verbatim_tokens, memo=memo)
        return view, renderer.render(view)
    preview = _preview(artifact, counter, policy, memo)
    view = _view(artifact, Form.PREVIEW, preview.text, ())
    text = renderer.render(view)
    learn_rendering(counter, text, preview)
    return view, text


def learn_rendering(counter: TokenCounter, text: str, preview: Preview) -> None:
    """Give ``counter`` the exact count of ``text``, a rendering of ``preview``'s text, made
    from the preview's blocks (nothing is learnt when it cannot be made exactly)."""
    if preview.blocks:
        tokens = _rendered_tokens(text, preview.text, preview.blocks, counter, preview.tokens)
        if tokens is not None:
            counter.learn(text, tokens)


def _rendered_tokens(
    text: str,
    source: str,
    blocks: tuple[tuple[int, int], ...],
    counter: TokenCounter,
    tokens: int = -1,
) -> int | None:
    """Exact count of a rendering ``head line, body, last line`` whose body is ``source``
    (as the renderer wrote it), from the counts of the blank-line separated ``blocks``
    (characters, tokens) that ``source`` is made of, or from ``source``'s own count
    (``tokens``, -1 if unknown) when the renderer wrote it unchanged.

    A renderer may escape characters but not newlines, so the body splits back into the
    blocks by their newlines; a block that reads as it was is not counted again, one the
    renderer changed is. None when ``text`` is not so laid out or the pieces may not add up.
    """
    start = text.find("\n") + 1
    end = text.rfind("\n")
    if start == 0 or end < start:
        return None
    body, tail = text[start:end], text[end + 1 :]
    if not starts_piece(body) or not starts_piece(tail):
        return None
    joined = (
        tokens if tokens >= 0 and body == source else _blocks_tokens(body, source, blocks, counter)
    )
    with_newline = (
        None if joined is None else count_with_sep_from(body, joined, "\n", counter.count)
    )
    if with_newline is None:
        return None
    return counter.count(text[:start]) + with_newline + counter.count(tail)


def _blocks_tokens(
    body: str, source: str, blocks: tuple[tuple[int, int], ...], counter: TokenCounter
) -> int | None:
    """Exact count of ``body``, ``source`` as a renderer wrote it, from ``source``'s
    ``blocks``: a block the renderer changed is counted again (None: not so laid out)."""
    parts: list[tuple[str, int]] = []
    pos = at = 0
    for i, (size, n) in enumerate(blocks):
        raw = source[at : at + size]
        at += size + 2
        stop = len(body)
        if i < len(blocks) - 1:
            stop = pos - 1
            for _ in range(raw.count("\n") + 1):
                stop = body.find("\n", stop + 1)
                if stop < 0:
                    return None
            if body[stop : stop + 2] != "\n\n":
                return None
        written = body[pos:stop]
        parts.append((written, n if written == raw else counter.count(written)))
        pos = stop + 2
    if pos < len(body):
        return None
    return count_joined_from(parts, "\n\n", counter.count)
