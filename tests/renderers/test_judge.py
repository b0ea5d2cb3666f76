"""The chat judge: each check finds what it names, in the turn where it happens, by fixed
criteria that no budget setting moves."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs

from lamina import Conversation
from lamina.pipeline import (
    Budget,
    Decision,
    DecisionAction,
    Envelope,
    Form,
    Layer,
    LayerName,
    Segment,
)
from lamina.pipeline.layout import Batch
from lamina.renderers import FREE_MARGIN, judge_chat
from lamina.renderers._judge import _has_prose, _open_frontmatter

VAULT = Path(__file__).resolve().parents[2] / "examples" / "vault"


def _segment(text: str, form: Form = Form.PREVIEW, tokens: int = 10) -> Segment:
    return Segment("note:a.md", form, "note", "h", text, tokens)


def _body(segment: Segment) -> list[str]:
    return segment.text.split("\n")[1:-1]


def test_a_block_of_headings_frontmatter_embeds_or_an_omitted_line_has_no_prose() -> None:
    for body in [
        "[... 2 more sections omitted ...]",
        "# A\n\n## B\n\n[... 1 more section omitted ...]",
        "---\ntags: [a]\n---\n![[A.base]]",
        "---\ntitle: open\nauthor: never closed",
    ]:
        assert not _has_prose(body.split("\n")), body
    for body in [
        "# A\n\nIt is the feeling I look to give.",
        "---\ntags: [a]\n---\n- a list item says something",
        "界面的语言",
    ]:
        assert _has_prose(body.split("\n")), body


def test_a_preview_that_opens_frontmatter_and_never_closes_it_is_found() -> None:
    assert _open_frontmatter(_segment('<note key="note:a.md">\n---\ntitle: A\nurl: x\n</note>'))
    assert not _open_frontmatter(
        _segment('<note key="note:a.md">\n---\ntitle: A\n---\nText.\n</note>')
    )
    assert not _open_frontmatter(
        _segment('<note key="note:a.md">\n---\ntitle: A\n</note>', Form.FULL)
    )
    assert not _open_frontmatter(_segment('<note key="note:a.md">\n---\n\nA rule.\n</note>'))


def test_unbudgeted_chat_cuts_nothing_and_counts_its_cache_and_its_bound() -> None:
    """The bound leaves uncached only what the second turn adds: its query and the reply."""
    conv = Conversation("Answer.", vault=VAULT)
    envs = [conv.turn("Spec?", [{"note": "project-spec.md"}])]
    conv.reply("It is a spec.")
    envs.append(conv.turn("Thanks."))
    j = judge_chat(envs, conv.counter)
    assert (j.turns, j.cut_turns, j.window_use, j.findings) == (2, 0, 1.0, ())
    assert 0 < j.cached_tokens < j.input_tokens
    assert j.input_tokens == sum(conv.count_request(e) for e in envs)
    second = envs[1]
    reply = second.l4.segments[-1]
    assert reply.role == "assistant"
    added = second.l3.tokens + second.l5.tokens + reply.tokens
    assert j.bound_tokens == conv.count_request(second) - added
    assert j.cached_of_bound == j.cached_share / j.cached_bound
    # The second request extends the first: all the bound leaves uncached is that turn's.
    assert second.batch is not None and second.batch.reason == ""
    assert j.forgone == (("extended", j.bound_tokens - j.cached_tokens),)


def test_the_cache_forgone_is_summed_by_how_each_request_was_sent() -> None:
    """Each request after the first adds its bound less its cached prefix under its
    batch's reason (``extended`` when it extended the last one): the sums make up the
    chat's bound less its cached tokens, the largest first; a request without a batch
    counts as ``unbatched``. (The real chats' reasons: ``tests/test_real_material.py``.)"""
    conv, envs = _budgeted_spec_chat()
    j = judge_chat(envs, conv.counter, budget=conv.budget)
    how = [e.batch.reason or "extended" for e in envs[1:] if e.batch is not None]
    assert how == ["extended"] * 3
    assert j.forgone == (("extended", j.bound_tokens - j.cached_tokens),)
    # The last request sent as built instead: its whole prefix is new, the largest part.
    last = attrs.evolve(envs[-1], batch=None)
    unbatched = judge_chat([*envs[:-1], last], conv.counter, budget=conv.budget)
    assert [k for k, _ in unbatched.forgone] == ["unbatched", "extended"]
    assert sum(n for _, n in unbatched.forgone) == (
        unbatched.bound_tokens - unbatched.cached_tokens
    )


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


def _budgeted_spec_chat() -> tuple[Conversation, list[Envelope]]:
    conv = Conversation(
        "Answer.", vault=VAULT, budget=Budget(context_window=3000, reserve_output=400)
    )
    return conv, _spec_chat(conv)


def _rebuilt(env: Envelope, library: tuple[Segment, ...], **report: Any) -> Envelope:
    """``env`` with ``library`` as its L2, sent as built, its budget report changed."""
    budget = env.report.budget
    assert budget is not None and env.l3.segments == ()
    l2 = Layer(LayerName.L2, library, sum(s.tokens for s in library))
    return attrs.evolve(
        env,
        layers=(env.l1, l2, env.l3, env.l4, env.l5),
        report=attrs.evolve(env.report, budget=attrs.evolve(budget, **report)),
        batch=None,
    )


def test_an_entry_shown_only_cut_is_left_cut_when_its_growth_fits_the_room_less_5pc() -> None:
    """A 10-token preview in a request sending 1,000 of a 2,000 limit: the room is 1,000
    less 5% of 2,000, so a full form of 910 tokens is left cut and one of 911 is not."""
    conv, envs = _budgeted_spec_chat()
    preview = _segment('<note key="note:a.md" form="preview">\nSome text.\n</note>')
    env = _rebuilt(envs[-1], (preview,), limit=2000, effective=1000)

    def left_cut(full: int) -> list[str]:
        j = judge_chat([env], conv.counter, budget=conv.budget, full_sizes={"note:a.md": full})
        return [f.key for f in j.findings if f.check == "left-cut"]

    assert 2000 * FREE_MARGIN == 100
    assert left_cut(910) == ["note:a.md"]
    assert left_cut(911) == []


def test_an_entry_of_the_deferred_growth_shown_only_cut_is_left_cut() -> None:
    """The same preview as the library's growth of a request that extends its batch
    (nothing of the library settled: the entry stands as the block an earlier user message
    sent) is left cut as in the system message. (The judge read the settled library only:
    obsidian-help mixed 32k held 40 release notes so, needing 11-86 tokens each with 28-88
    free, and none was counted.)"""
    conv, envs = _budgeted_spec_chat()
    preview = _segment('<note key="note:a.md" form="preview">\nSome text.\n</note>')
    env = _rebuilt(envs[-1], (preview,), limit=2000, effective=1000)
    user = Segment("history:5:user", Form.FULL, "history", "u", "Short?", 2)
    batch = Batch(settled=0, library_tokens=0, turns=(), user=user, tokens=1000, reason="")
    extending = attrs.evolve(env, batch=batch)
    j = judge_chat([extending], conv.counter, budget=conv.budget, full_sizes={"note:a.md": 910})
    assert [f.key for f in j.findings if f.check == "left-cut"] == ["note:a.md"]


def test_an_entry_set_aside_is_left_cut_when_its_full_form_fits_the_room_less_5pc() -> None:
    """A library entry an earlier request showed whole (900 tokens) and a later one leaves
    out altogether (set aside, kept unsent) is left cut when its full form fits the later
    request's room less 5% of the limit: at 1,000 of a 2,000 limit, yes; at 1,001, no."""
    conv, envs = _budgeted_spec_chat()
    whole = _segment('<note key="note:a.md">\nSome text.\n</note>', Form.FULL, tokens=900)
    shown = _rebuilt(envs[-1], (whole,), limit=2000, effective=1900)

    def left_cut(effective: int) -> list[str]:
        gone = _rebuilt(envs[-1], (), limit=2000, effective=effective)
        j = judge_chat([shown, gone], conv.counter, budget=conv.budget)
        return [f.key for f in j.findings if f.check == "left-cut" and f.turn == gone.turn]

    assert left_cut(1000) == ["note:a.md"]
    assert left_cut(1001) == []


def test_an_entry_set_aside_while_the_request_still_holds_it_whole_is_not_left_cut() -> None:
    """The same set-aside entry, its whole block sent by the request this one extends
    (``Batch.reason`` "": the request as sent still holds that block): the model has it
    in full, so it is not left cut; sent as built instead, the request holds it nowhere,
    and it is. (A 4,000-token window over tests/data/kepano-obsidian did this: turn 2 set
    aside a category note turn 1's message sent whole.)"""
    conv, envs = _budgeted_spec_chat()
    whole = _segment('<note key="note:a.md">\nSome text.\n</note>', Form.FULL, tokens=900)
    shown = _rebuilt(envs[-1], (whole,), limit=2000, effective=1900)
    gone = _rebuilt(envs[-1], (), limit=2000, effective=1000)
    user = Segment("history:5:user", Form.FULL, "history", "u", "Short?", 2)

    def left_cut(reason: str) -> list[str]:
        batch = Batch(settled=0, library_tokens=0, turns=(), user=user, tokens=0, reason=reason)
        j = judge_chat([shown, attrs.evolve(gone, batch=batch)], conv.counter, budget=conv.budget)
        return [f.key for f in j.findings if f.check == "left-cut" and f.turn == gone.turn]

    assert left_cut("") == []
    assert left_cut("over-budget") == ["note:a.md"]


def test_a_turn_that_only_gives_back_did_not_cut() -> None:
    """Window use counts the turns that cut: a turn whose budget only restored or recalled
    (sending more, not less) at 500 of a 2,000 limit is not one; with a compaction it is."""
    conv, envs = _budgeted_spec_chat()
    whole = _segment('<note key="note:a.md">\nSome text.\n</note>', Form.FULL)

    def judged(*actions: DecisionAction) -> tuple[int, float]:
        decisions = tuple(
            Decision("budget", "note:a.md", "preview", "full", "why", action=a) for a in actions
        )
        env = _rebuilt(envs[-1], (whole,), limit=2000, effective=500, decisions=decisions)
        j = judge_chat([env], conv.counter, budget=conv.budget)
        return j.cut_turns, j.window_use

    assert judged(DecisionAction.RESTORED, DecisionAction.RECALLED) == (0, 1.0)
    cut, use = judged(DecisionAction.RESTORED, DecisionAction.COMPACTED)
    assert cut == 1 and use < 0.5


def test_the_judgement_reads_no_budget_setting() -> None:
    """Judging the same chat with other settings, both in the budget given and in each
    report's plan (headroom, cache weight, text-free share), gives the same judgement:
    only the chat framing is read from the budget."""
    conv, envs = _budgeted_spec_chat()
    preview = _segment('<note key="note:a.md" form="preview">\nSome text.\n</note>')
    envs.append(_rebuilt(envs[-1], (preview,), limit=2000, effective=1000))
    assert conv.budget is not None
    other = attrs.evolve(conv.budget, headroom=0.4, cache_weight=2.0, text_free_share=0.5)
    plan = (("headroom_tokens", "1000"), ("headroom", "0.4"), ("text_free_share", "0.5"))
    replanned = [
        attrs.evolve(e, report=attrs.evolve(e.report, budget=attrs.evolve(b, plan=plan)))
        for e in envs
        if (b := e.report.budget) is not None
    ]
    assert len(replanned) == len(envs)
    sizes = {"note:a.md": 900}
    expected = judge_chat(envs, conv.counter, budget=conv.budget, full_sizes=sizes)
    assert expected.count("left-cut") == 1
    assert judge_chat(replanned, conv.counter, budget=other, full_sizes=sizes) == expected


def test_over_limit_and_text_free_share_are_read_from_the_request() -> None:
    """A request whose limit is below what it sends is over the limit; a 100-token stub in
    a 1,000-token window is a 10% text-free share."""
    conv, envs = _budgeted_spec_chat()
    stub = Segment("note:z.md", Form.REFERENCE, "note", "z", '<reference key="note:z.md"/>', 100)
    env = _rebuilt(envs[-1], (stub,), window=1000, limit=1000, effective=1001)
    j = judge_chat([env], conv.counter, budget=conv.budget)
    assert j.count("over-limit") == 1
    assert j.text_free_share == 0.1
    assert "1 over-limit findings" in j.misses()


def test_a_cut_form_without_prose_is_found_unless_its_full_form_has_none_either() -> None:
    """A summary holding only headings is a no-prose finding when the note's full form,
    seen earlier in the chat, held text; not when it held only properties and embeds."""
    conv, envs = _budgeted_spec_chat()

    def note(key: str, form: Form, body: str) -> Segment:
        return Segment(key, form, "note", "h", f'<note key="{key}">\n{body}\n</note>', 10)

    full = (note("note:a.md", Form.FULL, "# A\n\nIt says."), note("note:b.md", Form.FULL, "# B"))
    cut = (note("note:a.md", Form.SUMMARY, "# A"), note("note:b.md", Form.SUMMARY, "# B"))
    chat = [_rebuilt(envs[-1], full), attrs.evolve(_rebuilt(envs[-1], cut), turn=5)]
    j = judge_chat(chat, conv.counter, budget=conv.budget)
    assert [(f.turn, f.key) for f in j.findings if f.check == "no-prose"] == [(5, "note:a.md")]


def test_an_item_listed_only_in_an_index_is_left_cut_when_its_full_size_fits() -> None:
    """An index lists two items with their sizes in full; with 900 tokens free beyond 5% of
    the limit the 900-token one is left cut, the 901-token one is not."""
    conv, envs = _budgeted_spec_chat()
    lines = "\n".join(
        [
            "2 items of folder:f were attached but not sent for lack of room.",
            "- note:f/a.md | 900 tokens",
            "- note:f/b.md | B | 901 tokens",
        ]
    )
    index = Segment(
        "index:folder:f",
        Form.FULL,
        "index",
        "i",
        f'<index key="index:folder:f">\n{lines}\n</index>',
        30,
    )
    env = _rebuilt(envs[-1], (index,), limit=2000, effective=1000)
    j = judge_chat([env], conv.counter, budget=conv.budget)
    assert [f.key for f in j.findings if f.check == "left-cut"] == ["note:f/a.md"]


def test_the_attachments_sent_are_counted_against_their_whole() -> None:
    """This turn's context as sent over its whole: a 100-token preview of a note whose full
    form is 400, beside an index that lists a 300-token note sent only as its line, is
    100 of 700 sent; recalled passages and references to the library count for neither."""
    conv, envs = _budgeted_spec_chat()
    preview = _segment('<note key="note:a.md" form="preview">\nSome text.\n</note>', tokens=100)
    lines = "1 item of folder:f was not sent for lack of room.\n- note:f/b.md | 300 tokens"
    index = Segment("index:folder:f", Form.FULL, "index", "i", f"<index>\n{lines}\n</index>", 30)
    recalled = Segment("recalled:history", Form.FULL, "recalled", "r", "<recalled/>", 50)
    ref = Segment("note:c.md", Form.REFERENCE, "note", "c", '<reference key="note:c.md"/>', 9)
    env = envs[-1]
    l3 = Layer(LayerName.L3, (ref, preview, index, recalled), 189)
    env = attrs.evolve(env, layers=(env.l1, env.l2, l3, env.l4, env.l5))
    j = judge_chat([env], conv.counter, budget=conv.budget, full_sizes={"note:a.md": 400})
    assert (j.attached_tokens, j.attached_whole) == (100, 700)
    assert j.attached_share == 100 / 700
    assert "attachments sent 14.3%" in j.summary()
    first = judge_chat(envs[:1], conv.counter, budget=conv.budget)  # the spec, whole
    assert first.attached_tokens == first.attached_whole == envs[0].l3.segments[0].tokens
    assert first.attached_share == 1.0
