"""The chat judge: each check finds what it names, in the turn where it happens."""

from __future__ import annotations

from pathlib import Path

from lamina import Conversation
from lamina.pipeline import Budget, BudgetPlan, Envelope, Form, Segment
from lamina.renderers import ChatTargets, judge_chat
from lamina.renderers._judge import _is_empty_block

VAULT = Path(__file__).resolve().parents[2] / "examples" / "vault"


def _segment(text: str, form: Form = Form.PREVIEW) -> Segment:
    return Segment("note:a.md", form, "note", "h", text, 10)


def test_a_block_holding_only_its_omitted_line_is_empty() -> None:
    assert _is_empty_block(
        _segment('<note key="note:a.md">\n[... 2 more sections omitted ...]\n</note>')
    )
    assert not _is_empty_block(
        _segment('<note key="note:a.md">\n# A\n\n[... 1 more section omitted ...]\n</note>')
    )
    assert not _is_empty_block(_segment('<reference key="note:a.md"/>', Form.REFERENCE))


def test_unbudgeted_chat_cuts_nothing_and_counts_its_cache() -> None:
    conv = Conversation("Answer.", vault=VAULT)
    envs = [conv.turn("Spec?", [{"note": "project-spec.md"}])]
    conv.reply("It is a spec.")
    envs.append(conv.turn("Thanks."))
    j = judge_chat(envs, conv.counter)
    assert (j.turns, j.cut_turns, j.window_use, j.findings) == (2, 0, 1.0, ())
    assert 0 < j.cached_tokens < j.input_tokens
    assert j.input_tokens == sum(conv.count_request(e) for e in envs)


def _spec_chat(conv: Conversation) -> list[Envelope]:
    """The spec, the API notes, the spec again, then a short question (each replied to)."""
    envs = []
    for query, attach in [
        ("Spec?", [{"note": "project-spec.md"}]),
        ("API?", [{"note": "docs/api-docs.md"}]),
        ("Spec again.", [{"note": "project-spec.md"}]),
        ("Short?", []),
    ]:
        envs.append(conv.turn(query, attach))
        conv.reply("Answer.")
    return envs


def test_an_entry_the_budget_cut_is_found_while_its_full_form_would_fit() -> None:
    """The spec is cut to make room for the API notes, then a short question leaves most
    of the window free: the spec, still cut, is a finding of that turn."""
    conv = Conversation(
        "Answer.", vault=VAULT, budget=Budget(context_window=3000, reserve_output=400)
    )
    envs = _spec_chat(conv)
    j = judge_chat(envs, conv.counter, budget=conv.budget)
    cut = [f for f in j.findings if f.check == "left-cut"]
    for f in cut:  # each finding is a cut segment of its turn whose full form fits
        env = envs[f.turn - 1]
        assert env.report.budget is not None
        segments = (*env.l2.segments, *env.l3.segments)
        assert any(s.key == f.key and s.form is not Form.FULL for s in segments)
        need = int(f.detail.split(" needs ")[1].split()[0])
        assert 0 <= need <= env.report.budget.headroom
    assert j.cut_turns >= 1
    misses = j.misses(ChatTargets(window_use=0.0, cached_share=0.0, stub_share=1.0))
    assert misses == ((f"{len(cut)} left-cut findings",) if cut else ())


def test_an_entry_the_restore_schedule_gives_back_is_due_when_restores_are_off() -> None:
    """With restores off, the API notes cut while the spec is re-sent stay a summary when
    a short question leaves room for them beyond the slack: a restore-due finding of that
    turn; with restores on, the budget gives them back and nothing is found."""

    def chat(restore: bool) -> list[str]:
        plan = BudgetPlan(restore=restore, slack=0.01)
        budget = Budget(context_window=3400, reserve_output=400, plan=plan)
        # Each request as built (a batch would still hold the API notes in full).
        conv = Conversation("Answer.", vault=VAULT, budget=budget, defer_library=False)
        envs = _spec_chat(conv)
        j = judge_chat(envs, conv.counter, budget=budget)
        return [f"{f.turn} {f.key}" for f in j.findings if f.check == "restore-due"]

    assert chat(False) == ["4 note:docs/api-docs.md"]
    assert chat(True) == []
