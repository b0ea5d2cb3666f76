"""How a whole budgeted chat went: one judgement over its envelopes.

The budget decides turn by turn; whether the conversation kept what it knew and kept its
cache shows only over the whole chat. ``judge_chat`` measures, from the envelopes alone
(and the request's own count), on each request as sent (``Envelope.as_sent``: a batched
request holds the context of the turns since it settled, and cut entries sent whole
again): how full the window was in the turns that cut, the share of input tokens in a
repeated prefix, entries the model sees only cut while their full form would fit the
room the budget's plan leaves ("left-cut"; those that would fit only by taking the slack
the plan keeps for the next turns' growth are counted apart, "in-slack", not a miss),
the library entries the budget's in-place restore schedule says come back in that turn
("restore-due"), references that point at a stub, blocks that hold nothing but an
omitted-sections line, and how much of the window the stubs took. ``ChatTargets`` holds
the bounds a healthy chat meets; ``ChatJudgement.misses`` names the ones it does not.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import attrs

from lamina.pipeline import (
    RESTORED_INTRO,
    Budget,
    BudgetReport,
    Envelope,
    Form,
    Segment,
    TokenCounter,
)
from lamina.renderers._cache import prefix_reports, prompt_tokens
from lamina.renderers._layouts import default_prompt

__all__ = ["ChatFinding", "ChatJudgement", "ChatTargets", "judge_chat"]

_OMITTED = re.compile(r"\[\.\.\. \d+ more sections? omitted \.\.\.\]")


@attrs.frozen
class ChatFinding:
    """One thing wrong in one turn: which check, the key and a sentence."""

    turn: int
    check: str
    key: str
    detail: str


@attrs.frozen
class ChatTargets:
    """The bounds of a healthy budgeted chat (the defaults are the project's targets)."""

    window_use: float = 0.90
    """Mean window use (request over the budget's limit) in the turns that cut, at least."""
    cached_share: float = 0.60
    """Share of all input tokens that repeat the previous request's prefix, at least."""
    stub_share: float = 0.10
    """Stubs' tokens over the window, in every turn, at most."""


@attrs.frozen
class ChatJudgement:
    """The measures of one chat; ``findings`` lists each entry left cut, reference to a
    stub and empty block with its turn."""

    turns: int
    cut_turns: int
    window_use: float
    """Mean of used / limit over the turns with budget decisions (1.0 when none cut)."""
    input_tokens: int
    cached_tokens: int
    stub_share: float
    """The largest share of the window stubs took in one turn."""
    findings: tuple[ChatFinding, ...] = ()

    @property
    def cached_share(self) -> float:
        return self.cached_tokens / self.input_tokens if self.input_tokens else 0.0

    def count(self, check: str) -> int:
        """How many findings of ``check`` ("left-cut", "in-slack", "restore-due",
        "stub-reference", "empty-block")."""
        return sum(1 for f in self.findings if f.check == check)

    def misses(self, targets: ChatTargets | None = None) -> tuple[str, ...]:
        """The targets this chat misses, each as a sentence with the measured value."""
        t = targets or ChatTargets()
        out: list[str] = []
        if self.cut_turns and self.window_use < t.window_use:
            out.append(f"window use in turns that cut {self.window_use:.0%} < {t.window_use:.0%}")
        if self.cached_share < t.cached_share:
            out.append(f"cached-prefix share {self.cached_share:.0%} < {t.cached_share:.0%}")
        if self.stub_share > t.stub_share:
            out.append(f"stubs took {self.stub_share:.0%} of the window > {t.stub_share:.0%}")
        for check in ("left-cut", "restore-due", "stub-reference", "empty-block"):
            if self.count(check):
                out.append(f"{self.count(check)} {check} findings")
        return tuple(out)

    def summary(self) -> str:
        """One line of the measures, for reports and test messages."""
        return (
            f"{self.turns} turns, {self.cut_turns} cut; window use {self.window_use:.1%}; "
            f"cached {self.cached_share:.1%} of {self.input_tokens:,}; stubs "
            f"{self.stub_share:.1%}; left cut {self.count('left-cut')} (in the slack "
            f"{self.count('in-slack')}, restore due {self.count('restore-due')}), stub references "
            f"{self.count('stub-reference')}, empty blocks {self.count('empty-block')}"
        )


def _is_stub(segment: Segment) -> bool:
    """A library entry kept only as its reference (evicted)."""
    return segment.form is Form.REFERENCE


def _is_empty_block(segment: Segment) -> bool:
    """A block whose body is only an omitted-sections line."""
    if segment.form is Form.REFERENCE:
        return False
    lines = segment.text.strip().split("\n")
    return len(lines) >= 2 and _OMITTED.fullmatch("\n".join(lines[1:-1]).strip()) is not None


def _changed_at(before: Envelope | None, env: Envelope) -> int:
    """The first position at which ``env``'s library differs from ``before``'s (where the
    system message, and so the cached prefix, breaks); its length when it only grew."""
    if before is None:
        return 0
    old, new = before.l2.segments, env.l2.segments
    for i, (a, b) in enumerate(zip(old, new, strict=False)):
        if (a.key, a.content_hash, a.form, a.tokens) != (b.key, b.content_hash, b.form, b.tokens):
            return i
    return min(len(old), len(new))


def _restore_due(
    env: Envelope,
    report: BudgetReport,
    fitting: Sequence[tuple[Segment, int]],
    room: int,
    restore_min: float,
    changed: int,
) -> list[ChatFinding]:
    """The library entries left cut that the budget's restore schedule says come back in
    this turn: those whose full forms fit the headroom less the plan's slack together
    (largest growth first, as the budget takes them) when they give back at least
    ``restore_min`` of the limit (a batch restore is due), or, in a turn that changed
    the library anyway (the prefix breaks there: a refill is due), those from the first
    entry it changed (``changed``) on. The schedule waits for the rest on purpose
    (docs/BUDGET.md, "Cuts are reversible")."""
    if not fitting or room <= 0:
        return []

    def take(candidates: Sequence[tuple[Segment, int]]) -> tuple[list[tuple[Segment, int]], int]:
        taken: list[tuple[Segment, int]] = []
        gained = 0
        for seg, grow in sorted(candidates, key=lambda f: -f[1]):  # largest first, as the budget
            if gained + grow <= room:
                taken.append((seg, grow))
                gained += grow
        return taken, gained

    taken, gained = take(fitting)
    if gained < restore_min * report.limit:
        # No batch restore is due; where the library changed anyway, a refill is, of the
        # entries from the first one changed on (earlier ones would break it sooner).
        broke = any(str(d.layer) in ("L1", "L2") for d in report.decisions)
        order = {seg.key: i for i, seg in enumerate(env.l2.segments)}
        after = [(seg, grow) for seg, grow in fitting if order[seg.key] >= changed]
        taken = take(after)[0] if broke else []
    return [
        ChatFinding(
            env.turn,
            "restore-due",
            seg.key,
            f"{seg.form} of {seg.tokens} tokens; its full form needs {grow} more, within the "
            f"{room} free beyond the slack, and the schedule restores in this turn",
        )
        for seg, grow in taken
    ]


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
    is never reported as left cut, nor one no budget decision cut (a large note carried
    into the library as its preview by design)."""
    sizes: dict[tuple[str, str], int] = {}
    cut: set[str] = set()  # keys a budget decision cut and no library has held whole since
    visible: set[tuple[str, str]] = set()  # full copies in the request as sent
    findings: list[ChatFinding] = []
    uses: list[float] = []
    stub_share = 0.0
    reports = prefix_reports(envelopes, counter, budget=budget)
    total = sum(prompt_tokens(default_prompt(e), counter, budget) for e in envelopes)
    cached = sum(r.common_prefix_tokens for r in reports)
    previous: Envelope | None = None
    for env in envelopes:
        before, previous = previous, env
        batch = env.batch
        if batch is None or batch.reason:
            visible = set()  # a request as built: only what it holds itself
        shown = env.l2.segments if batch is None else env.l2.segments[: batch.settled]
        restored = () if batch is None else batch.restored
        for seg in (*shown, *env.l3.segments, *restored):
            if seg.form is Form.FULL:
                sizes.setdefault((seg.key, seg.content_hash), seg.tokens)
                visible.add((seg.key, seg.content_hash))
        cut.difference_update(s.key for s in shown if s.form is Form.FULL)
        report = env.report.budget
        if report is not None:
            cut.update(d.target for d in report.decisions if d.to_form != "full")
        stubs = {s.key for s in env.l2.segments if _is_stub(s)}
        for seg in env.l3.segments:
            if seg.form is Form.REFERENCE and not seg.unsent and seg.key in stubs:
                findings.append(
                    ChatFinding(env.turn, "stub-reference", seg.key, "refers to a library stub")
                )
        for seg in (*env.l2.segments, *env.l3.segments):
            if _is_empty_block(seg):
                findings.append(
                    ChatFinding(env.turn, "empty-block", seg.key, "only an omitted-sections line")
                )
        if report is None:
            continue
        sent = report.effective
        if batch is not None and batch.tokens:
            sent = budget.effective(batch.tokens) if budget is not None else batch.tokens
        if report.decisions:
            uses.append(sent / report.limit if report.limit else 1.0)
        if report.window:
            stub_tokens = sum(s.tokens for s in env.l2.segments if _is_stub(s))
            stub_share = max(stub_share, stub_tokens / report.window)
        plan = dict(report.plan)
        slack = int(plan.get("slack_tokens", "0"))
        free = report.limit - sent
        library = {seg.key for seg in shown}
        intro = 2 if restored else counter.count(RESTORED_INTRO) + 4
        fitting: list[tuple[Segment, int]] = []
        for seg in (*shown, *env.l3.segments):
            shown_cut = seg.form in (Form.PREVIEW, Form.SUMMARY) or (
                seg.form is Form.REFERENCE and (seg.unsent or seg.key in stubs)
            )
            if not shown_cut or seg.key not in cut or (seg.key, seg.content_hash) in visible:
                continue
            full = sizes.get((seg.key, seg.content_hash), (full_sizes or {}).get(seg.key))
            if full is None:
                continue
            # A library entry is sent whole again beside its cut form (under the intro
            # line, with a separator); this turn's item grows in place.
            cost = full + intro if seg.key in library else full - seg.tokens
            check = "left-cut" if cost <= free - slack else "in-slack" if cost <= free else ""
            if check:
                findings.append(
                    ChatFinding(
                        env.turn,
                        check,
                        seg.key,
                        f"{seg.form} of {seg.tokens} tokens; its full {full} needs {cost} "
                        f"and {free} are free ({slack} of them the plan's slack)",
                    )
                )
            room = report.headroom - slack  # in place, as built: the restore schedule's
            if full - seg.tokens <= room and seg.key in library:
                fitting.append((seg, full - seg.tokens))
        restore_min = float(plan.get("restore_min", "0"))
        changed = _changed_at(before, env)
        findings.extend(
            _restore_due(env, report, fitting, report.headroom - slack, restore_min, changed)
        )
    return ChatJudgement(
        turns=len(envelopes),
        cut_turns=len(uses),
        window_use=sum(uses) / len(uses) if uses else 1.0,
        input_tokens=total,
        cached_tokens=cached,
        stub_share=stub_share,
        findings=tuple(findings),
    )
