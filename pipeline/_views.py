"""Views of an artifact in each form, and the carry-forward form L2 keeps."""

from __future__ import annotations

from typing import Literal, Protocol

import attrs

from pipeline._artifacts import Artifact
from pipeline._envelope import Form, View
from pipeline._errors import ConfigError
from pipeline._summarize import Summarizer, SummaryCache
from pipeline._tokens import TokenCounter, count_joined_from, count_with_sep_from, starts_piece

__all__ = [
    "Policy",
    "SegmentRenderer",
    "carry_forward",
    "excerpt_view",
    "full_view",
    "preview_view",
    "reference_view",
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
    """Turns a typed view into segment text (XML by default: ``renderers.XmlRenderer``)."""

    def render(self, view: View) -> str: ...


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


def preview_view(
    artifact: Artifact,
    counter: TokenCounter,
    policy: Policy,
    marks: tuple[tuple[str, str], ...] = (),
) -> View:
    from pipeline._preview import make_preview

    preview = make_preview(
        artifact.payload.body(),
        counter,
        max_sections=policy.max_sections,
        section_tokens=policy.section_tokens,
        headless_tokens=policy.headless_tokens,
    )
    return _view(artifact, Form.PREVIEW, preview.text, marks)


def excerpt_view(
    artifact: Artifact,
    counter: TokenCounter,
    max_tokens: int,
    marks: tuple[tuple[str, str], ...] = (),
) -> View:
    from pipeline._preview import make_excerpt

    excerpt = make_excerpt(artifact.payload.body(), counter, max_tokens)
    return _view(artifact, Form.EXCERPT, excerpt.text, marks)


def summary_view(
    artifact: Artifact,
    cache: SummaryCache,
    summarizer: Summarizer,
    target_tokens: int,
    marks: tuple[tuple[str, str], ...] = (),
) -> View:
    """A memoized abstractive-or-extractive summary; never for non-recoverable artifacts."""
    if not artifact.recoverable:
        raise ValueError(f"{artifact.key} is not recoverable and may only be excerpted")
    body = artifact.payload.body()
    result = cache.summarize(summarizer, artifact.content_hash, body, target_tokens)
    return _view(artifact, Form.SUMMARY, result.text, marks)


def carry_forward(
    artifact: Artifact, counter: TokenCounter, policy: Policy, renderer: SegmentRenderer
) -> tuple[View, str]:
    """The form an artifact takes when promoted into L2 (DESIGN.md compaction classes), and
    its text. The full rendering is usually counted already (it is what L3 sent), so
    deciding costs no encoding; a preview's rendering is counted from its sections' counts
    when the renderer keeps the preview verbatim (see ``_rendered_tokens``)."""
    from pipeline._preview import make_preview

    view = full_view(artifact)
    text = renderer.render(view)
    if counter.count(text) <= policy.verbatim_tokens:
        return view, text
    if not artifact.recoverable:
        view = excerpt_view(artifact, counter, policy.verbatim_tokens)
        return view, renderer.render(view)
    preview = make_preview(
        artifact.payload.body(),
        counter,
        max_sections=policy.max_sections,
        section_tokens=policy.section_tokens,
        headless_tokens=policy.headless_tokens,
    )
    view = _view(artifact, Form.PREVIEW, preview.text, ())
    text = renderer.render(view)
    if preview.blocks:
        tokens = _rendered_tokens(text, preview.blocks, counter)
        if tokens is not None:
            counter.learn(text, tokens)
    return view, text


def _rendered_tokens(
    text: str, blocks: tuple[tuple[str, int], ...], counter: TokenCounter
) -> int | None:
    """Exact count of a rendering ``head line, body, last line`` whose body is the blocks
    (as the renderer wrote them), joined by blank lines, from the blocks' counts.

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
    parts: list[tuple[str, int]] = []
    pos = 0
    for i, (raw, n) in enumerate(blocks):
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
    joined = count_joined_from(parts, "\n\n", counter.count)
    with_newline = (
        None if joined is None else count_with_sep_from(body, joined, "\n", counter.count)
    )
    if with_newline is None:
        return None
    return counter.count(text[:start]) + with_newline + counter.count(tail)
