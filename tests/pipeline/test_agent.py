"""Agent loops: calls and results as one unit, fitted to the budget; L4 keeps the answer."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

from lamina import Conversation
from lamina.pipeline import Budget, DecisionAction, SystemPrompt, check_envelope
from lamina.pipeline._conversation.agent import QUESTION_AGAIN, AgentTurn, agent_call
from lamina.pipeline.errors import BudgetExceeded, ConfigError, InvariantViolation

QUESTION = "Which devices lost edits last week?"


def _payload(step: int) -> str:
    return "\n".join(
        f"Hit {step}.{i}: device {i} pushed {step * i} ops to the sync log." for i in range(120)
    )


def _recorded(agent: AgentTurn, steps: int = 10) -> AgentTurn:
    for n in range(1, steps + 1):
        if n % 2:
            agent = agent.step(agent_call("search", {"q": f"edits {n}"}, _payload(n)))
        else:
            agent = agent.step(
                agent_call("read_note", {"path": f"log-{n}.md"}, f"# Log {n}\n\nShort note."),
                agent_call("search", {"q": f"lost {n}"}, _payload(n)),
                text=f"Checking step {n}.",
            )
    return agent


def test_ten_step_loop_fits_and_repeats_the_question_once_per_large_payload(vault: Path) -> None:
    budget = Budget(context_window=16000, reserve_output=1000)
    conv = Conversation("You are an agent.", vault=vault, budget=budget)
    agent = _recorded(
        AgentTurn.start(conv, QUESTION, [{"note": "docs/auth.md"}], repeat_after_tokens=500)
    )
    loop = agent.fit()
    assert loop.tokens <= budget.limit
    assert loop.report is not None and loop.report.used == loop.tokens
    contents = [c for s in loop.steps for c in s.calls]
    large = [c for c in contents if c.form != "stub" and c.name == "search"]
    assert large, "the newest search result is kept"
    for call in large:
        assert call.content.count(QUESTION) == 1
        assert call.content.endswith(QUESTION_AGAIN + QUESTION)
    assert all(QUESTION not in c.content for c in contents if c.name == "read_note")


def test_old_results_become_stubs_that_keep_name_and_args(vault: Path) -> None:
    conv = Conversation("", vault=vault, budget=Budget(context_window=9000, reserve_output=1000))
    loop = _recorded(AgentTurn.start(conv, QUESTION)).fit()
    stubs = [c for s in loop.steps for c in s.calls if c.form == "stub"]
    assert stubs
    for call in stubs:
        assert call.name in call.content and call.args in call.content
    assert loop.steps[-1].calls[-1].form != "stub"
    assert all(d.stage == "agent" and d.tokens_saved > 0 for d in loop.decisions)


def test_loop_that_cannot_fit_raises_with_a_report(vault: Path) -> None:
    conv = Conversation("", vault=vault, budget=Budget(context_window=400, reserve_output=100))
    agent = AgentTurn.start(conv, QUESTION)
    agent = agent.step(
        *(agent_call("paste", {"n": i}, _payload(i), recoverable=False) for i in range(6))
    )
    with pytest.raises(BudgetExceeded) as err:
        agent.fit()
    assert err.value.report is not None


def test_finish_keeps_bare_query_and_answer_in_history(vault: Path) -> None:
    conv = Conversation("", vault=vault)
    agent = _recorded(AgentTurn.start(conv, QUESTION), 3)
    agent.finish(
        conv,
        "Devices 3 and 7. "
        '<tool_result><note key="note:a.md" title="A" path="a.md">x</note></tool_result>',
    )
    nxt = conv.turn("Thanks")
    assert nxt.history() == (
        ("user", QUESTION),
        ("assistant", "Devices 3 and 7. [tool_result: A (a.md)]"),
    )
    assert all("Hit 1.1" not in s.text for s in nxt.l4.segments)
    check_envelope(nxt)


def test_plain_chat_mode_has_no_tool_blocks(vault: Path) -> None:
    conv = Conversation("Be brief.", vault=vault)
    env = conv.turn("Hello")
    assert env.user_text == "Hello" and env.l3.segments == ()
    loop = AgentTurn(env, "Hello", conv.counter).fit()
    assert loop.steps == () and loop.tokens > 0


def test_call_ids_are_deterministic_and_unique(vault: Path) -> None:
    conv = Conversation("", vault=vault)
    agent = _recorded(AgentTurn.start(conv, QUESTION), 2)
    ids = [c.id for s in agent.steps for c in s.calls]
    assert ids == ["call_1_1", "call_2_1", "call_2_2"]


def test_script_turns_carry_tools_and_recorded_agent_steps(vault: Path) -> None:
    from lamina import parse_script, run_script
    from lamina.pipeline.errors import ScriptError

    script = parse_script(
        {
            "turns": [
                {"user": "Hi", "reply": "hi"},
                {"user": "S", "tools": [{"name": "search", "args": {"q": "x"}, "result": "R1"}]},
                {
                    "user": "A",
                    "agent": [{"calls": [{"name": "search", "args": {"q": "y"}, "result": "R2"}]}],
                },
            ]
        }
    )
    envs = run_script(script, Conversation("", vault=vault))
    assert "R1" in envs[1].user_text and envs[1].user_text.index("R1") < envs[1].user_text.index(
        "S"
    )
    assert envs[2].user_text == "A"
    with pytest.raises(ScriptError, match=r"turns\[0\]\.tools\[0\]"):
        parse_script({"turns": [{"user": "x", "tools": [{"name": 3}]}]})


def test_the_loops_running_count_equals_a_recount_and_framing_comes_from_the_budget(
    vault: Path,
) -> None:
    """Each cut moves the loop's count by one call's change; the result equals a whole
    recount, and a budget's own tool-call framing is what the loop counts."""
    conv = Conversation("", vault=vault, budget=Budget(context_window=9000, reserve_output=1000))
    agent = _recorded(AgentTurn.start(conv, QUESTION))
    loop = agent.fit()
    assert loop.decisions, "the window is tight enough to cut"
    assert loop.tokens == agent.base_tokens() + agent.loop_tokens(loop.steps)
    calls = sum(len(s.calls) for s in agent.steps)
    roomy = Budget(context_window=90000, reserve_output=1000)
    wide = Budget(context_window=90000, reserve_output=1000, tool_call_tokens=20)
    plain = attrs.evolve(agent, budget=roomy).fit().tokens
    assert attrs.evolve(agent, budget=wide).fit().tokens == plain + 12 * calls


def _big_vault(root: Path) -> Path:
    for k in range(3):
        parts = (
            f"## Part {j}\n\n" + " ".join(f"word{k}{j}{i}" for i in range(120)) for j in range(12)
        )
        (root / f"n{k}.md").write_text(f"# Note {k}\n\n" + "\n\n".join(parts), encoding="utf-8")
    return root


RESULT = "Results: " + " ".join(f"finding-{i} on sync" for i in range(60))


def _full_turn(vault: Path, window: int) -> AgentTurn:
    """A turn whose attachments alone overflow the window, after one turn of history."""
    conv = Conversation(
        "You answer from search results.",
        vault=vault,
        budget=Budget(context_window=window, reserve_output=300),
    )
    conv.turn("Question 0?", [{"note": "n0.md"}])
    conv.reply("Answer 0. " * 30)
    return AgentTurn.start(conv, "What changed?", [{"note": "n1.md"}, {"note": "n2.md"}])


def test_the_first_tool_calls_fit_in_every_window(tmp_path: Path) -> None:
    """131 windows (1,500-14,500) whose turn fills them: with the default headroom three
    calls fit without cutting the turn again (before: 80 of 131 raised BudgetExceeded)."""
    vault = _big_vault(tmp_path)
    for window in range(1500, 14600, 100):
        agent = _full_turn(vault, window)
        budget = agent.budget
        assert budget is not None
        for n in range(3):
            agent = agent.step(agent_call("search", {"q": f"s{n}"}, RESULT))
            loop = agent.fit()
            assert budget.effective(loop.tokens) <= budget.limit, window
            assert all(d.stage == "agent" for d in loop.decisions), window
            assert loop.envelope is agent.envelope


def test_an_overflowing_loop_cuts_the_turn_in_the_turns_order(tmp_path: Path) -> None:
    """A turn that fits with 40 tokens to spare and no headroom: the loop excerpts the new
    result as far as it goes, then the turn is solved again in less room (the newest
    library entry goes first: a cut there breaks the least of the cached prefix), never
    stubs the result the model has not seen, and sends the cut turn's envelope."""
    vault = _big_vault(tmp_path)

    def agent_in(window: int) -> AgentTurn:
        roomy = Budget(context_window=100_000, reserve_output=300)
        conv = Conversation("You answer from search results.", vault=vault, budget=roomy)
        conv.turn("Question 0?", [{"note": "n0.md"}, {"note": "n1.md"}])
        conv.reply("Answer 0.")
        # A turn with room gives back whole the notes carried forward as previews, so
        # the loop's turn finds its library as it will send it.
        conv.turn("Question 1?")
        conv.reply("Answer 1.")
        conv.budget = Budget(context_window=window, reserve_output=300)
        return AgentTurn.start(conv, "What changed?", tool_headroom=0)

    roomy = agent_in(100_000)
    agent = agent_in(roomy.base_tokens() + 300 + 40)
    assert agent.envelope.report.decisions == ()
    agent = agent.step(agent_call("search", {"q": "s0"}, RESULT))
    loop = agent.fit()
    assert agent.budget is not None
    assert agent.budget.effective(loop.tokens) <= agent.budget.limit
    stages = [d.stage for d in loop.decisions]
    assert stages == sorted(stages, key=["agent", "budget"].index), "the loop's cuts first"
    turn_cuts = [d for d in loop.decisions if d.stage == "budget"]
    assert (turn_cuts[0].layer, turn_cuts[0].target) == ("L2", "note:n1.md")
    assert loop.steps[-1].calls[-1].form == "excerpt"
    assert loop.envelope is not agent.envelope
    assert loop.envelope.l2.tokens < agent.envelope.l2.tokens
    assert loop.tokens == agent.budget.used(loop.envelope, agent.counter) + agent.loop_tokens(
        loop.steps
    )


def test_tool_definitions_are_counted_and_left_room_for(vault: Path) -> None:
    """``tools_tokens`` is in every request of the loop and the turn leaves room for it."""
    budget = Budget(context_window=6000, reserve_output=500)
    conv = Conversation("You are an agent.", vault=vault, budget=budget)
    plain = AgentTurn.start(conv, QUESTION, tool_headroom=0)
    conv.reply("done")
    tooled = AgentTurn.start(conv, QUESTION, tool_headroom=0, tools_tokens=700)
    assert tooled.fit().tokens == tooled.base_tokens() + 700
    assert plain.fit().tokens == plain.base_tokens()
    with pytest.raises(ConfigError, match="tool definitions"):
        AgentTurn.start(conv, QUESTION, tools_tokens=budget.limit)


LONG_INSTRUCTIONS = "Dig through the notes and cite each one you use. " * 30


def test_a_handoff_sends_the_new_instructions_counted_and_fitted_like_the_turns(
    tmp_path: Path,
) -> None:
    """After ``with_system`` the loop sends the new agent's instructions as L1's mutable
    part; longer ones than the turn was fitted for are fitted by solving the turn again
    (the newest library entry gives way), the count equals a recount, a ``handoff``
    decision (L1) explains the break, and the turn's own envelope is unchanged."""
    vault = _big_vault(tmp_path)
    roomy = Budget(context_window=100_000, reserve_output=300)
    conv = Conversation(SystemPrompt("You answer.", "Route."), vault=vault, budget=roomy)
    conv.turn("Question 0?", [{"note": "n0.md"}, {"note": "n1.md"}])
    conv.reply("Answer 0.")
    size = AgentTurn.start(conv, "Size?", tool_headroom=0).base_tokens()
    conv.reply("Sized.")
    conv.budget = Budget(context_window=size + 300 + 80, reserve_output=300)
    agent = AgentTurn.start(conv, "What changed?", tool_headroom=0)
    agent = agent.step(agent_call("transfer_to_researcher", {}, "{}"))
    before = agent.fit()
    handed = agent.with_system(SystemPrompt("You answer.", LONG_INSTRUCTIONS))
    loop = handed.step(agent_call("search", {"q": "s0"}, "Found n0.")).fit()
    budget = handed.budget
    assert budget is not None and budget.effective(loop.tokens) <= budget.limit
    sent = loop.envelope.l1.get("system:mutable")
    assert sent is not None and sent.text == LONG_INSTRUCTIONS, "whole: the library gave way"
    assert loop.envelope.system_text.startswith("You answer.\n\nDig through the notes")
    cuts = [d for d in loop.decisions if d.stage == "budget"]
    assert (cuts[0].layer, cuts[0].target) == ("L2", "note:n1.md")
    assert loop.tokens == budget.used(loop.envelope, handed.counter) + handed.loop_tokens(
        loop.steps
    )
    l1 = [d for d in loop.envelope.report.decisions if d.layer == "L1"]
    assert [d.action for d in l1] == [DecisionAction.HANDOFF]
    check_envelope(loop.envelope, before.envelope)
    assert handed.envelope is agent.envelope
    assert agent.envelope.system_text.startswith("You answer.\n\nRoute.\n\n")


def test_a_handoff_without_a_budget_changes_only_l1s_mutable_part(vault: Path) -> None:
    conv = Conversation(SystemPrompt("You answer.", "Route."), vault=vault)
    conv.turn("Question 0?", [{"note": "docs/auth.md"}])
    conv.reply("Answer 0.")
    agent = AgentTurn.start(conv, QUESTION)
    handed = agent.with_system(SystemPrompt("You answer.", "Dig."))
    before, after = agent.fit().envelope, handed.fit().envelope
    assert after.system_text == before.system_text.replace("Route.", "Dig.", 1)
    assert (after.l2, after.l3, after.l4, after.l5) == (before.l2, before.l3, before.l4, before.l5)
    assert after.l1.tokens == conv.counter.count("You answer.\n\nDig.")
    assert (
        handed.fit().tokens
        == handed.base_tokens()
        == agent.base_tokens()
        + (conv.counter.count("You answer.\n\nDig.") - conv.counter.count("You answer.\n\nRoute."))
    )
    check_envelope(after, before)
    back = handed.with_system(SystemPrompt("You answer.", "Route."))
    assert back.fit().envelope.system_text == before.system_text
    assert [d.action for d in back.sent.report.decisions if d.layer == "L1"] == [
        DecisionAction.HANDOFF,
        DecisionAction.HANDOFF,
    ]


@pytest.mark.parametrize("defer_library", [True, False])
def test_the_turn_after_a_handoff_says_handoff_against_the_loops_last_request(
    vault: Path, defer_library: bool
) -> None:
    """A loop handed off (triage -> researcher); the next turn starts with the triage
    instructions again. Its first request against the loop's last one is a ``handoff``
    break with a decision that explains it (it was ``memory-changed`` with none), both
    with ``after`` (what the adapters do) and from the previous request alone."""
    from lamina.renderers import classify_break

    conv = Conversation(
        SystemPrompt("You answer.", "Route."), vault=vault, defer_library=defer_library
    )
    agent = AgentTurn.start(conv, "Question 0?", [{"note": "docs/auth.md"}])
    agent = agent.step(agent_call("transfer_to_researcher", {}, "{}"))
    handed = agent.with_system(SystemPrompt("You answer.", "Dig."))
    last = handed.step(agent_call("search", {"q": "auth"}, "Found it.")).fit().envelope
    handed.finish(conv, "Answer 0.")
    plain = AgentTurn.start(conv, "Question 1?")
    assert classify_break(last, plain.fit().envelope) == ("handoff",)  # from ``last``
    nxt = plain.after(last)
    first = nxt.fit().envelope
    assert classify_break(last, first) == ("handoff",)
    assert [d.action for d in first.report.decisions if d.layer == "L1"] == [DecisionAction.HANDOFF]
    check_envelope(first, last)  # raised: the system message changed, no decision said why
    with pytest.raises(InvariantViolation, match="no decision says why"):
        check_envelope(plain.fit().envelope, last)
    assert first.system_text == plain.fit().envelope.system_text
    assert nxt.envelope is plain.envelope  # the turn as built (saved) is unchanged
    assert plain.after(first) is plain and plain.after(None) is plain
