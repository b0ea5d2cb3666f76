"""Prefix-change reports: scripted changes produce the expected break reason, and no
break is reported where the previous request's cacheable bytes did not change."""

from __future__ import annotations

from pathlib import Path

import attrs
from hypothesis import given, settings
from hypothesis import strategies as st

from lamina import Conversation
from lamina.pipeline import (
    Budget,
    Decision,
    DecisionAction,
    Envelope,
    Form,
    Library,
    Pipeline,
    Policy,
    SystemPrompt,
    TurnGraph,
)
from lamina.renderers import (
    annotate_trace,
    chatml,
    common_prefix_length,
    common_prefix_tokens,
    openai_messages,
    prefix_report,
    prefix_reports,
    prompt_prefix_tokens,
    render_report,
    trace_document,
)
from lamina.renderers._layouts import default_prompt

VAULT = Path(__file__).resolve().parents[2] / "examples" / "vault"
SYSTEM = SystemPrompt("You answer from the attached context.", "Memory: short answers.")


def _conv(**kw: object) -> Conversation:
    """The library grown every turn (``defer_library=False``): the breaks these tests
    classify are the library layout's; a deferred library is tested at the end."""
    kw.setdefault("defer_library", False)
    return Conversation(SYSTEM, vault=VAULT, **kw)  # type: ignore[arg-type]


def _two_turns(conv: Conversation) -> None:
    conv.turn("Summarize", [{"note": "project-spec.md"}, {"note": "glossary.md"}])
    conv.reply("A spec.")


def test_first_turn_and_unchanged_growth() -> None:
    conv = _conv()
    envs = [conv.turn("Summarize", [{"note": "project-spec.md"}])]
    conv.reply("A spec.")
    envs.append(conv.turn("And the API?", [{"note": "docs/api-docs.md"}]))
    conv.reply("Endpoints.")
    envs.append(conv.turn("Thanks"))
    reports = prefix_reports(envs, conv.counter)
    assert [r.break_reason for r in reports] == ["first-turn", None, None]
    assert reports[0].common_prefix_tokens == 0
    assert reports[2].trace() == {
        "common_prefix_tokens": reports[2].common_prefix_tokens,
        "break_reason": None,
    }


def test_common_prefix_counts_tokens_and_bytes() -> None:
    conv = _conv()
    a = conv.turn("Summarize", [{"note": "project-spec.md"}])
    conv.reply("A spec.")
    b = conv.turn("Thanks")
    report = prefix_report(a, b, conv.counter)
    prev, cur = openai_messages(a), openai_messages(b)
    # The request's own count: the shared start of the system text (L1, before the new
    # library), never the ChatML markup's tokens read as text.
    assert report.common_prefix_tokens == prompt_prefix_tokens(
        default_prompt(a), default_prompt(b), conv.counter
    )
    l1 = conv.counter.encode(a.system_text)
    assert report.common_prefix_tokens == common_prefix_length(
        l1, conv.counter.encode(b.system_text)
    )
    assert common_prefix_tokens(prev, cur, conv.counter) > report.common_prefix_tokens
    shared = chatml(cur).encode()[: report.common_prefix_bytes]
    assert chatml(prev).encode().startswith(shared)
    assert report.common_prefix_bytes >= len(a.system_text.encode())
    assert report.l2_hash == b.l2.hash and report.l1_hash == b.l1.hash


def _glossary_edited(conv: Conversation) -> tuple[Envelope, Envelope]:
    """A quiet turn, then a turn that re-attaches the glossary after editing it."""
    _two_turns(conv)
    before = conv.turn("Anything new?")
    conv.reply("No.")
    after = conv.turn(
        "Now?",
        [{"note": "glossary.md"}],
        vault_changes={"glossary.md": "# Glossary\n\nHLC: a clock.\n"},
    )
    return before, after


def test_edit_under_pin_is_not_a_break() -> None:
    conv = _conv()
    before, after = _glossary_edited(conv)
    assert prefix_report(before, after, conv.counter).break_reason is None
    assert after.l3.segments[0].form is Form.FULL


def test_edit_under_refresh_is_an_artifact_change() -> None:
    conv = _conv(policy=Policy(freshness="refresh"))
    before, after = _glossary_edited(conv)
    assert prefix_report(before, after, conv.counter).reasons == (
        "artifact-changed:note:glossary.md",
    )


def test_a_deferred_library_keeps_the_prefix_through_a_refresh_it_never_sent() -> None:
    """The glossary was sent in a user message and never entered the system message, so
    its refresh breaks nothing: the new text goes in this turn's user message."""
    conv = _conv(policy=Policy(freshness="refresh"), defer_library=True)
    before, after = _glossary_edited(conv)
    assert prefix_report(before, after, conv.counter).reasons == ()
    assert "HLC: a clock." in openai_messages(after)[-1]["content"]


def test_settling_the_deferred_library_is_a_reported_break() -> None:
    conv = _conv(defer_library=True)
    _two_turns(conv)
    before = conv.turn("Anything new?")
    conv.reply("No.")
    conv.set_system(mutable="Memory: long answers.")
    after = conv.turn("Now?")
    assert after.batch is not None and after.batch.reason == "system-changed"
    assert prefix_report(before, after, conv.counter).reasons == ("memory-changed",)


def test_memory_change() -> None:
    conv = _conv()
    _two_turns(conv)
    before = conv.turn("Anything new?")
    conv.reply("No.")
    conv.set_system(mutable="Memory: long answers.")
    after = conv.turn("Now?")
    assert prefix_report(before, after, conv.counter).break_reason == "memory-changed"


def test_a_handoff_in_an_agent_loop_is_its_own_break_reason() -> None:
    """An agent loop's handoff to other instructions breaks at L1's mutable part with the
    ``handoff`` reason (its typed decision), and the sentence says so; a memory change
    made by the host is still ``memory-changed``."""
    from lamina.pipeline.agent import AgentTurn
    from lamina.renderers import explain_cache

    conv = _conv()
    _two_turns(conv)
    agent = AgentTurn.start(conv, "Anything new?")
    handed = agent.with_system(SystemPrompt(SYSTEM.stable, "Dig through the notes."))
    before, after = agent.fit().envelope, handed.fit().envelope
    report = prefix_report(before, after, conv.counter)
    assert report.reasons == ("handoff",)
    assert after.system_text == before.system_text.replace(SYSTEM.mutable, "Dig through the notes.")
    trace = {"turn": 3, "tokens_total": 900, "cache": report.trace()}
    assert explain_cache(trace) == (
        "The agent loop handed off to an agent with other instructions, which replace the "
        "system prompt's mutable part; the library and history after it are sent uncached.",
    )
    conv.reply("No.")
    conv.set_system(mutable="Memory: long answers.")
    assert prefix_report(after, conv.turn("Now?"), conv.counter).reasons == ("memory-changed",)


def test_system_change() -> None:
    conv = _conv()
    _two_turns(conv)
    before = conv.turn("Anything new?")
    conv.set_system(stable="You are a pirate.")
    after = conv.turn("Now?")
    assert prefix_report(before, after, conv.counter).break_reason == "system-changed"


@attrs.frozen
class _Cut:
    """A stand-in budget stage: evict or compact one L2 entry, with an L2 decision."""

    key: str
    evict: bool
    name: str = "cut"
    after: tuple[str, ...] = ("reference",)
    before: tuple[str, ...] = ("promote",)

    def __call__(self, turn: TurnGraph) -> TurnGraph:
        entry = turn.library.get(self.key)
        if entry is None:
            return turn
        if self.evict:
            library = Library(tuple(e for e in turn.library if e.key != self.key))
            decision = Decision(
                self.name,
                self.key,
                str(entry.form),
                "evicted",
                "budget",
                layer="L2",
                action=DecisionAction.EVICTED,
            )
        else:
            view = attrs.evolve(entry.view, form=Form.PREVIEW, body="(shortened)")
            text = turn.ctx.renderer.render(view)
            library = turn.library.replace(attrs.evolve(entry, view=view, text=text))
            decision = Decision(
                self.name,
                self.key,
                str(entry.form),
                "preview",
                "budget",
                layer="L2",
                action=DecisionAction.COMPACTED,
            )
        return attrs.evolve(turn, library=library).decide(decision)


def _cut_run(evict: bool) -> tuple[Envelope, Envelope, Conversation]:
    conv = _conv()
    _two_turns(conv)
    before = conv.turn("Anything new?")
    conv.reply("No.")
    conv.pipeline = Pipeline.default().with_stage(_Cut("note:project-spec.md", evict))
    return before, conv.turn("Now?"), conv


def test_budget_eviction_is_reported_with_its_key() -> None:
    before, after, conv = _cut_run(evict=True)
    assert after.l2.get("note:project-spec.md") is None
    assert prefix_report(before, after, conv.counter).reasons == (
        "l2-evicted:note:project-spec.md",
    )


def test_budget_compaction_is_reported_with_its_key() -> None:
    before, after, conv = _cut_run(evict=False)
    assert (
        prefix_report(before, after, conv.counter).break_reason
        == "l2-compacted:note:project-spec.md"
    )


def test_history_cut_moved() -> None:
    conv = _conv()
    _two_turns(conv)
    conv.turn("Second")
    conv.reply("Two.")
    before = conv.turn("Third")
    conv.reply("Three.")
    after = conv.turn("Fourth")
    l4 = after.l4
    cut = attrs.evolve(l4, segments=l4.segments[2:])
    trimmed = attrs.evolve(after, layers=(after.l1, after.l2, after.l3, cut, after.l5))
    assert prefix_report(before, trimmed, conv.counter).break_reason == "history-cut-moved"
    assert prefix_report(before, after, conv.counter).break_reason is None


@settings(max_examples=300, deadline=None)
@given(
    shared=st.text(alphabet="ab é漢😀\n", max_size=40),
    a=st.text(alphabet="ab é漢😀\n", max_size=5),
    b=st.text(alphabet="ab é漢😀\n", max_size=5),
)
def test_common_prefix_bytes_equals_comparing_the_encodings(shared: str, a: str, b: str) -> None:
    from lamina.renderers._cache import _common_prefix_bytes

    left, right = shared + a, shared + b
    expected = common_prefix_length(left.encode(), right.encode())
    assert _common_prefix_bytes(left, right) == expected


def _reworded(env: Envelope) -> Envelope:
    """``env`` with every decision's reason reworded (what a person reads, nothing else)."""

    def reword(decisions: tuple[Decision, ...]) -> tuple[Decision, ...]:
        return tuple(attrs.evolve(d, reason=f"Reworded: {d.reason.upper()}") for d in decisions)

    report = env.report
    budget = report.budget
    if budget is not None:
        budget = attrs.evolve(budget, decisions=reword(budget.decisions))
    return attrs.evolve(
        env, report=attrs.evolve(report, decisions=reword(report.decisions), budget=budget)
    )


def test_rewording_a_reason_changes_no_break_reason_and_no_report_reading() -> None:
    """Readers match a decision's action: reworded reasons keep every break reason, and the
    HTML report differs only in the reworded text itself."""
    conv = _conv(policy=Policy(freshness="refresh"), budget=Budget(1100, 200))
    envs = list(_glossary_edited(conv))
    conv.reply("Yes.")
    envs.append(conv.turn("More?", [{"note": "docs/api-docs.md"}]))
    actions = {d.action for e in envs for d in e.report.decisions}
    assert {DecisionAction.REFRESHED, DecisionAction.COMPACTED} <= actions
    reworded = [_reworded(e) for e in envs]
    assert [d.reason for d in reworded[-1].report.decisions] != [
        d.reason for d in envs[-1].report.decisions
    ]
    reasons = [r.reasons for r in prefix_reports(envs, conv.counter)]
    assert "artifact-changed:note:glossary.md" in reasons[1]
    assert [r.reasons for r in prefix_reports(reworded, conv.counter)] == reasons
    trace = annotate_trace(trace_document(envs, conv.counter), envs, conv.counter)
    again = annotate_trace(trace_document(reworded, conv.counter), reworded, conv.counter)
    assert [t["cache"] for t in again["turns"]] == [t["cache"] for t in trace["turns"]]
    html, html_again = render_report(trace), render_report(again)
    for d in (d for e in envs if e.report.budget for d in e.report.budget.decisions):
        html_again = html_again.replace(_html(f"Reworded: {d.reason.upper()}"), _html(d.reason))
    assert html_again == html


def _html(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
