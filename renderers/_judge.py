"""How a whole budgeted chat went: one judgement over its envelopes, by fixed criteria.

The budget decides turn by turn; whether the conversation kept what it knew and kept its
cache shows only over the whole chat. ``judge_chat`` measures, from the envelopes alone
(and the request's own count), on each request as sent (``Envelope.as_sent``: a batched
request holds the context of the turns since it settled, and cut entries sent whole
again). Nothing it checks is read from the budget's settings or plan, so no knob of the
budget makes it pass more easily (docs/BUDGET.md; STYLE.md, "Judges that cannot be
tuned"). It reports:

1. window use: the request as sent over the limit, averaged over the turns that cut (a
   budget decision that sends less than there was: not a restore or a recall);
2. the cached-prefix share of all input tokens, and its bound: the share when only what
   each turn adds (its context, the query and the last reply) is uncached;
3. ``left-cut``: an entry the request shows only cut (preview, summary, stub or a line
   of an index, with no full copy anywhere in it) while the growth to its full form fits
   the room the request leaves less a fixed ``FREE_MARGIN`` of the limit;
4. the text-free share: stubs plus index blocks over the window, the largest in a turn;
5. ``no-prose``: a preview, summary or excerpt whose body holds no prose (only headings,
   frontmatter, embeds or an omitted-sections line), unless the entry's full form seen in
   the chat holds none either (a note of properties and embeds has no text to lose);
6. ``open-frontmatter``: a cut form that opens frontmatter (a ``---`` line followed by a
   property, not a blank line: that is a rule) and never closes it;
7. ``over-limit``: a request as sent over the limit;
8. ``stub-reference``: a reference in this turn's context to a library stub.

``ChatTargets`` holds the project's fixed bounds; ``ChatJudgement.misses`` names the ones a
chat does not meet.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import attrs

from lamina.pipeline import Budget, DecisionAction, Envelope, Form, Segment
from lamina.pipeline.layout import RECALL_SOURCE
from lamina.pipeline.tokens import TokenCounter
from lamina.pipeline.tools import TOOL_SOURCE, chunk_source
from lamina.renderers._cache import prefix_reports, prompt_tokens
from lamina.renderers._layouts import default_prompt

__all__ = ["FREE_MARGIN", "ChatFinding", "ChatJudgement", "ChatTargets", "judge_chat"]

FREE_MARGIN = 0.05
"""The share of the limit a request may leave free before an entry it shows only cut, whose
full form would fit the rest, counts as left cut (the next turn's growth needs some room)."""

_CUT_FORMS = frozenset({Form.PREVIEW, Form.SUMMARY, Form.EXCERPT})
_GIVES_BACK = frozenset({DecisionAction.RESTORED, DecisionAction.RECALLED})
"""Budget decisions that send more, not less: a turn with only these did not cut."""
_OMITTED = re.compile(r"\[\.\.\. \d+ more sections? omitted \.\.\.\]")
_EMBED_OR_LINK = re.compile(r"!?\[\[[^\]]*\]\]|!\[[^\]]*\]\([^)]*\)")
_LETTER = re.compile(r"[^\W\d_]")
_FENCE = "---"
_SIZE = re.compile(r"\d+ tokens")


@attrs.frozen
class ChatFinding:
    """One thing wrong in one turn: which check, the key and a sentence."""

    turn: int
    check: str
    key: str
    detail: str


@attrs.frozen
class ChatTargets:
    """The bounds of a healthy budgeted chat (the defaults are the project's targets); a
    test may hold one chat to a documented other bound (a single large-folder turn:
    window use 0.85)."""

    window_use: float = 0.90
    """Mean window use (request as sent over the limit) in the turns that cut, at least."""
    cached_of_bound: float = 0.80
    """Cached-prefix share over its bound (``ChatJudgement.cached_bound``), at least."""
    text_free_share: float = 0.10
    """Stubs plus index blocks over the window, in every turn, at most."""


@attrs.frozen
class ChatJudgement:
    """The measures of one chat; ``findings`` lists each entry left cut, block without
    prose, open frontmatter, request over the limit and reference to a stub, by turn."""

    turns: int
    cut_turns: int
    window_use: float
    """Mean of sent / limit over the turns with budget decisions (1.0 when none cut)."""
    input_tokens: int
    cached_tokens: int
    bound_tokens: int
    """The cached tokens when each request leaves uncached only what its turn adds."""
    text_free_share: float
    """The largest share of the window stubs and index blocks took in one turn."""
    findings: tuple[ChatFinding, ...] = ()
    attached_tokens: int = 0
    """Tokens of what the turns attached, as their requests sent it (this turn's context:
    neither recalled passages nor references to the library)."""
    attached_whole: int = 0
    """The same attachments whole: each block's full form, and the full size an index
    line lists for an item sent only as that line (items counted in an index without a
    line, and blocks whose full size is unknown, count as sent)."""
    forgone: tuple[tuple[str, int], ...] = ()
    """The bound's tokens the requests left uncached (``bound_tokens - cached_tokens``),
    by how each request after the first was sent: ``extended`` (its batch extended
    the last request) or why it settled (``Batch.reason``: ``system-changed``,
    ``history-changed``, ``over-budget``...; ``unbatched`` without a batch), the largest
    first: where a chat's cache goes."""

    @property
    def attached_share(self) -> float:
        """What the requests sent of the turns' attachments, over their whole (1.0 when
        nothing was attached): the value the cache price trades against."""
        return self.attached_tokens / self.attached_whole if self.attached_whole else 1.0

    @property
    def cached_share(self) -> float:
        return self.cached_tokens / self.input_tokens if self.input_tokens else 0.0

    @property
    def cached_bound(self) -> float:
        """The cached-prefix share when only each turn's context, query and last reply are
        uncached (the first request is uncached whole)."""
        return self.bound_tokens / self.input_tokens if self.input_tokens else 0.0

    @property
    def cached_of_bound(self) -> float:
        """The cached share over its bound (1.0 when the bound is 0: nothing could be)."""
        return self.cached_share / self.cached_bound if self.cached_bound else 1.0

    def count(self, check: str) -> int:
        """How many findings of ``check`` ("left-cut", "no-prose", "open-frontmatter",
        "over-limit", "stub-reference")."""
        return sum(1 for f in self.findings if f.check == check)

    def misses(self, targets: ChatTargets | None = None) -> tuple[str, ...]:
        """The targets this chat misses, each as a sentence with the measured value."""
        t = targets or ChatTargets()
        out: list[str] = []
        if self.cut_turns and self.window_use < t.window_use:
            out.append(f"window use in turns that cut {self.window_use:.0%} < {t.window_use:.0%}")
        if self.cached_of_bound < t.cached_of_bound:
            out.append(
                f"cached-prefix share {self.cached_share:.0%} is {self.cached_of_bound:.0%} of "
                f"its bound {self.cached_bound:.0%} < {t.cached_of_bound:.0%}"
            )
        if self.text_free_share > t.text_free_share:
            out.append(
                f"stubs and indexes took {self.text_free_share:.0%} of the window > "
                f"{t.text_free_share:.0%}"
            )
        for check in ("left-cut", "no-prose", "open-frontmatter", "over-limit", "stub-reference"):
            if self.count(check):
                out.append(f"{self.count(check)} {check} findings")
        return tuple(out)

    def summary(self) -> str:
        """One line of the measures, for reports and test messages."""
        return (
            f"{self.turns} turns, {self.cut_turns} cut; window use {self.window_use:.1%}; "
            f"cached {self.cached_share:.1%} of {self.input_tokens:,} (bound "
            f"{self.cached_bound:.1%}, {self.cached_of_bound:.0%} of it); stubs+indexes "
            f"{self.text_free_share:.1%}; attachments sent {self.attached_share:.1%}; left cut "
            f"{self.count('left-cut')}, no prose "
            f"{self.count('no-prose')}, open frontmatter {self.count('open-frontmatter')}, "
            f"over limit {self.count('over-limit')}, stub references "
            f"{self.count('stub-reference')}"
        )


def _body(segment: Segment) -> list[str]:
    """The lines between a block's opening and closing tag lines."""
    lines = segment.text.strip().split("\n")
    return lines[1:-1] if len(lines) >= 2 else []


def _open_frontmatter(segment: Segment) -> bool:
    """A cut form whose body opens frontmatter and never closes it."""
    body = _body(segment)
    return (
        segment.form in _CUT_FORMS
        and len(body) > 1
        and body[0].strip() == _FENCE
        and body[1].strip() != ""  # a rule followed by a blank line is no frontmatter
        and all(line.strip() != _FENCE for line in body[1:])
    )


def _has_prose(lines: Sequence[str]) -> bool:
    """Whether ``lines`` hold a line of prose: a line with a letter that is not a
    heading, frontmatter (a leading block fenced by ``---``, or one never closed), an
    omitted-sections line, or only embeds and wiki links."""
    rest = list(lines)
    if len(rest) > 1 and rest[0].strip() == _FENCE and rest[1].strip():
        closing = next((i for i, line in enumerate(rest[1:], 1) if line.strip() == _FENCE), None)
        rest = rest[closing + 1 :] if closing is not None else []
    for line in rest:
        text = line.strip()
        if not text or text.startswith("#") or _OMITTED.fullmatch(text):
            continue
        if _LETTER.search(_EMBED_OR_LINK.sub("", text)):
            return True
    return False


def _index_lines(segment: Segment) -> list[tuple[str, int]]:
    """The items an index block lists with their size in full: ``- key | title | N
    tokens`` lines (a count-only index lists none)."""
    out: list[tuple[str, int]] = []
    for line in _body(segment):
        if not line.startswith("- "):
            continue
        fields = line[2:].split(" | ")
        size = next((f for f in fields[1:] if _SIZE.fullmatch(f)), None)
        if size is not None:
            out.append((fields[0], int(size.split()[0])))
    return out


def _library_named(env: Envelope) -> set[str]:
    """The library entries a request shows: its L2 blocks (in the system message or in the
    messages that carry the library's deferred growth) and the entries its index blocks
    list."""
    named = {s.key for s in env.l2.segments if s.text and s.source_type != "index"}
    for seg in env.l2.segments:
        if seg.source_type == "index":
            named.update(key for key, _ in _index_lines(seg))
    return named


def _enters_library(segment: Segment) -> bool:
    """A block of this turn's context the library takes in: not an index, a tool result,
    a retrieval chunk or recalled messages (this turn's only)."""
    scoped = ("index", RECALL_SOURCE, TOOL_SOURCE)
    return segment.source_type not in scoped and chunk_source(segment.key) is None


def _is_stub(segment: Segment) -> bool:
    """A library entry kept only as its reference (evicted)."""
    return segment.form is Form.REFERENCE


def _is_text_free(segment: Segment) -> bool:
    """A stub or an index block: it names entries without their text."""
    return _is_stub(segment) or segment.source_type == "index"


def _added_tokens(env: Envelope) -> int:
    """What this turn adds to the conversation: its context, its query and the reply to
    the previous turn (the last history message, when the assistant's)."""
    history = env.l4.segments
    reply = history[-1].tokens if history and history[-1].role == "assistant" else 0
    return env.l3.tokens + env.l5.tokens + reply


def _sent_tokens(env: Envelope, budget: Budget | None) -> int:
    """The request as sent, in the budget report's unit (its effective count)."""
    report = env.report.budget
    assert report is not None
    batch = env.batch
    if batch is not None and batch.tokens:
        return budget.effective(batch.tokens) if budget is not None else batch.tokens
    return report.effective


def judge_chat(
    envelopes: Sequence[Envelope],
    counter: TokenCounter,
    *,
    budget: Budget | None = None,
    full_sizes: Mapping[str, int] | None = None,
) -> ChatJudgement:
    """Judge a chat from its envelopes in order (``budget``: the chat framing requests are
    counted with). An entry's full size is the tokens of its first full block seen in the
    chat (same key and content), else ``full_sizes[key]``; an entry of unknown full size
    is never reported as left cut. A library entry an earlier request showed (as a block
    or an index line) that a request leaves out altogether is cut too (set aside)."""
    sizes: dict[tuple[str, str], int] = {}
    shown_before: set[str] = set()  # library entries an earlier request showed
    latest: dict[str, int] = {}  # each key's latest full block seen
    visible: set[tuple[str, str]] = set()  # full copies in the request as sent
    no_prose: set[tuple[str, str]] = set()  # entries whose full form holds no prose either
    findings: list[ChatFinding] = []
    uses: list[float] = []
    text_free = 0.0
    sent_now = whole_now = 0  # each turn's context: as sent, and whole
    reports = prefix_reports(envelopes, counter, budget=budget)
    totals = [prompt_tokens(default_prompt(e), counter, budget) for e in envelopes]
    later = zip(totals[1:], envelopes[1:], strict=True)  # the first request adds everything
    bounds = [max(0, total - _added_tokens(env)) for total, env in later]
    bound = sum(bounds)
    forgone = _forgone(envelopes[1:], bounds, [r.common_prefix_tokens for r in reports[1:]])
    for env in envelopes:
        batch = env.batch
        if batch is None or batch.reason:
            visible = set()  # a request as built: only what it holds itself
        shown = env.l2.segments if batch is None else env.l2.segments[: batch.settled]
        restored = () if batch is None else batch.restored
        sent = (*shown, *env.l3.segments, *restored)
        for seg in sent:
            if seg.form is Form.FULL:
                sizes.setdefault((seg.key, seg.content_hash), seg.tokens)
                latest[seg.key] = seg.tokens
                visible.add((seg.key, seg.content_hash))
                if not _has_prose(_body(seg)):
                    no_prose.add((seg.key, seg.content_hash))
        stubs = {s.key for s in env.l2.segments if _is_stub(s)}

        def find(check: str, key: str, detail: str, turn: int = env.turn) -> None:
            findings.append(ChatFinding(turn, check, key, detail))

        for seg in env.l3.segments:
            if seg.form is Form.REFERENCE and not seg.unsent and seg.key in stubs:
                find("stub-reference", seg.key, "refers to a library stub")
            if seg.source_type == "index":
                whole_now += sum(size for _, size in _index_lines(seg))
            elif seg.text and seg.form is not Form.REFERENCE and seg.source_type != RECALL_SOURCE:
                size = sizes.get((seg.key, seg.content_hash), (full_sizes or {}).get(seg.key, 0))
                sent_now += seg.tokens
                whole_now += max(size, seg.tokens)
        for seg in sent:
            if (
                seg.form in _CUT_FORMS
                and (seg.key, seg.content_hash) not in no_prose
                and not _has_prose(_body(seg))
            ):
                find("no-prose", seg.key, f"a {seg.form} of {seg.tokens} tokens without prose")
            if _open_frontmatter(seg):
                find("open-frontmatter", seg.key, f"a {seg.form} opens frontmatter, never closes")
        report = env.report.budget
        if report is None:
            continue
        used = _sent_tokens(env, budget)
        if used > report.limit:
            find("over-limit", "", f"{used} tokens sent over the limit {report.limit}")
        if any(d.action not in _GIVES_BACK for d in report.decisions):
            uses.append(used / report.limit if report.limit else 1.0)
        if report.window:
            share = sum(s.tokens for s in sent if _is_text_free(s)) / report.window
            text_free = max(text_free, share)
        room = report.limit - used - FREE_MARGIN * report.limit
        whole = {key for key, _ in visible}
        for seg in sent:
            for key, listed in _index_lines(seg) if seg.source_type == "index" else ():
                if key not in whole and listed <= room:
                    find(
                        "left-cut",
                        key,
                        f"an index line in {seg.key}; its full {listed} fits the {room:.0f} "
                        f"free beyond {FREE_MARGIN:.0%} of the limit",
                    )
        library = _library_named(env)
        attached = {s.key for s in env.l3.segments if s.text and _enters_library(s)}
        here = library | attached | {s.key for s in restored}
        for key in sorted(shown_before - here - whole):  # not in full in the request either
            full = latest.get(key, (full_sizes or {}).get(key))
            if full is not None and full <= room:
                find(
                    "left-cut",
                    key,
                    f"set aside (not in the request); its full {full} fits the {room:.0f} "
                    f"free beyond {FREE_MARGIN:.0%} of the limit",
                )
        shown_before |= library | attached
        # The library's growth too: an extending request holds it in the earlier messages.
        for seg in (*env.l2.segments, *env.l3.segments):
            shown_cut = seg.form in _CUT_FORMS or (
                seg.form is Form.REFERENCE and (seg.unsent or seg.key in stubs)
            )
            if not shown_cut or (seg.key, seg.content_hash) in visible:
                continue
            full = sizes.get((seg.key, seg.content_hash), (full_sizes or {}).get(seg.key))
            if full is not None and full - seg.tokens <= room:
                find(
                    "left-cut",
                    seg.key,
                    f"{seg.form} of {seg.tokens} tokens; its full {full} needs "
                    f"{full - seg.tokens} more and {room:.0f} are free beyond "
                    f"{FREE_MARGIN:.0%} of the limit",
                )
    return ChatJudgement(
        turns=len(envelopes),
        cut_turns=len(uses),
        window_use=sum(uses) / len(uses) if uses else 1.0,
        input_tokens=sum(totals),
        cached_tokens=sum(r.common_prefix_tokens for r in reports),
        bound_tokens=bound,
        text_free_share=text_free,
        findings=tuple(findings),
        attached_tokens=sent_now,
        attached_whole=whole_now,
        forgone=forgone,
    )


def _forgone(
    envelopes: Sequence[Envelope], bounds: Sequence[int], cached: Sequence[int]
) -> tuple[tuple[str, int], ...]:
    """``ChatJudgement.forgone``: each request's bound less what it kept cached (``bounds``
    and ``cached``: the requests after the first), summed by how it was sent."""
    by: dict[str, int] = {}
    for env, bound, kept in zip(envelopes, bounds, cached, strict=True):
        how = "unbatched" if env.batch is None else env.batch.reason or "extended"
        by[how] = by.get(how, 0) + bound - kept
    return tuple(sorted(by.items(), key=lambda kv: (-kv[1], kv[0])))
