"""The budget and this turn's attachments: each keeps the best form that fits."""

from __future__ import annotations

import itertools
import math
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from lamina import Conversation, parse_script
from lamina.pipeline import Budget, Envelope, Form, check_envelope
from lamina.pipeline._budget.objective import MIN_PREVIEW_TOKENS
from lamina.pipeline.errors import BudgetExceeded
from lamina.pipeline.layout import NOT_SENT_INTRO, REFERENCES_INTRO
from lamina.pipeline.tokens import get_encoding
from lamina.pipeline.views import fit_preview
from lamina.processors import ProcessContext, Sources, Vault, folder, note
from lamina.renderers import judge_chat
from tests.pipeline.test_budget import exact_request_tokens
from tests.strategies import conversations, localize, serve_site, write_property_vault

ENC = get_encoding("o200k_base")
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "vault"


@pytest.fixture(scope="module")
def prop_vault(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    root = write_property_vault(tmp_path_factory.mktemp("currentvault"))
    with serve_site(root / "site") as base:
        yield root, base


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(script=conversations, window=st.integers(min_value=600, max_value=6000))
def test_no_reference_dangles_under_any_window(
    script: dict[str, Any], window: int, prop_vault: tuple[Path, str]
) -> None:
    """Every request fits, and every reference points at what is sent, never at a stub:
    at the library's whole, or at the cut form it holds, which the reference names."""
    root, base = prop_vault
    parsed = parse_script(localize(script, base), "generated")
    sources = Sources(context=ProcessContext(vault=Vault(root), allow_private_network=True))
    budget = Budget(window, window // 5)
    conv = Conversation(parsed.system, sources=sources, budget=budget)
    previous: Envelope | None = None
    for turn in parsed.turns:
        try:
            env = conv.turn(turn.user, turn.attach, vault_changes=dict(turn.vault_changes))
        except BudgetExceeded:
            break
        check_envelope(env, previous)
        assert exact_request_tokens(env) <= budget.limit
        library = {s.key for s in env.l2.segments}
        for seg in env.l3.segments:
            if seg.form is Form.REFERENCE and seg.key not in library:
                assert seg.unsent or seg.key.startswith("chunk:")
            if seg.form is Form.REFERENCE and seg.key in library and not seg.unsent:
                held = next(s for s in env.l2.segments if s.key == seg.key).form
                assert held is Form.FULL or f'library="{held}"' in seg.text
        previous = env
        if turn.reply is not None:
            conv.reply(turn.reply)


def _three_turns(budget: Budget) -> Envelope:
    conv = Conversation("You are terse.", vault=EXAMPLE, budget=budget)
    first = [note("project-spec.md"), note("docs/api-docs.md")]
    conv.turn("Read the spec and the API docs.", first)
    conv.reply("Read them.")
    conv.turn(
        "And the design review and the talk.",
        [
            {"pdf": "media/sync-design-review.pdf"},
            {
                "youtube": "https://youtu.be/abcdefghijk",
                "transcript": "media/offline-sync-talk.vtt",
            },
        ],
    )
    conv.reply("Done.")
    return conv.turn("How does auth work?", [note("docs/auth.md")])


def test_the_three_turn_example_weighs_auth_md_against_the_cache() -> None:
    """The issue's example: window 3400, reserve 400. At the default ``cache_weight``
    (0.9) docs/auth.md reaches the model as a preview under its title: the room its whole
    form needs would come from the API notes' cached 1,240-token preview, whose cut loses
    that cache and more of their text than auth.md's other 160 tokens bring (the lexical
    relevance finds "auth" in the spec and the API notes, not in auth.md, which says
    "authentication"). With the cache free (0) the API notes give up 439 tokens and
    auth.md's preview grows: the price is what keeps their cache. (It went whole at 0.2
    while a unit attached this turn was worth x1.5, a step at age 0 of its recency.)"""
    env = _three_turns(Budget(3400, 400))
    auth = env.l3.get("note:docs/auth.md")
    assert auth is not None and auth.form is Form.PREVIEW and auth.tokens == 60
    assert "# Authentication\nFieldbook uses OAuth 2.0 with PKCE" in auth.text
    api = env.l2.get("note:docs/api-docs.md")
    assert api is not None and api.form is Form.PREVIEW and api.tokens == 1_240
    assert exact_request_tokens(env) <= 3000
    free = _three_turns(Budget(3400, 400, cache_weight=0.0))
    auth = free.l3.get("note:docs/auth.md")
    assert auth is not None and auth.form is Form.PREVIEW and auth.tokens > 60
    api = free.l2.get("note:docs/api-docs.md")
    assert api is not None and api.tokens == 801
    assert exact_request_tokens(free) <= 3000


def _sectioned(changed: str = "") -> str:
    sections = [
        f"## Part {i}\n\n" + " ".join(f"Detail {i}.{k} of the design." for k in range(14))
        for i in range(8)
    ]
    if changed:
        sections[6] = f"## Part 6\n\n{changed}"
    return "# Design\n\n" + "\n\n".join(sections) + "\n"


def test_an_edited_note_under_a_budget_sends_the_changed_section(tmp_path: Path) -> None:
    """The library holds the note as the model saw it; the new version, too big for a
    tighter window, is previewed with the changed section chosen first and shown in
    document order."""
    (tmp_path / "design.md").write_text(_sectioned(), encoding="utf-8")
    conv = Conversation("You are terse.", vault=tmp_path, budget=Budget(4000, 400))
    conv.turn("Read this.", [note("design.md")])
    conv.reply("Read.")
    assert conv.library.get("note:design.md").form is Form.FULL
    edit = "The retry limit is now seven attempts, raised from three."
    (tmp_path / "design.md").write_text(_sectioned(edit), encoding="utf-8")
    conv.budget = Budget(900, 200)
    env = conv.turn("What changed?", [note("design.md")])
    check_envelope(env)
    seg = env.l3.get("note:design.md")
    assert seg is not None and seg.form is Form.PREVIEW  # too big to resend in full
    assert edit in seg.text
    assert seg.text.index("# Design") < seg.text.index("## Part 6")  # document order


def test_a_preview_keeps_the_sections_the_query_names() -> None:
    from lamina.pipeline.tokens import TokenCounter

    body = "# Guide\n\n" + "\n\n".join(
        f"## {name}\n\n" + f"All about {name.lower()}. " * 40
        for name in ("Install", "Configure", "Deploy", "Rollback", "Monitoring")
    )
    counter = TokenCounter()
    words = frozenset({"rollback"})
    text = fit_preview(body, counter, 200, words=words)
    assert "## Rollback" in text and len(ENC.encode_ordinary(text)) <= 200
    assert text == fit_preview(body, counter, 200, words=words)  # deterministic
    plain = fit_preview(body, counter, 200)
    assert "## Rollback" not in plain and plain.startswith("# Guide")


def _big_note(rng_seed: int, sections: int, words: int) -> str:
    parts = [f"# Note {rng_seed}"]
    for s in range(sections):
        words_ = " ".join(f"w{rng_seed}x{s}y{k}." for k in range(words))
        parts.append(f"## Section {s}\n\n{words_}")
    return "\n\n".join(parts) + "\n"


@settings(max_examples=25, deadline=None)
@given(
    shapes=st.lists(st.tuples(st.integers(1, 12), st.integers(20, 400)), min_size=1, max_size=6),
    window=st.integers(min_value=1500, max_value=12000),
)
# Made previews measured below their guesses: the room they left went unused (81%, 71%).
@example(shapes=[(8, 273), (3, 170), (5, 121), (6, 143)], window=1888)
@example(shapes=[(11, 345), (9, 167)], window=2430)
def test_the_window_is_used_when_the_content_exceeds_it(
    tmp_path_factory: pytest.TempPathFactory, shapes: list[tuple[int, int]], window: int
) -> None:
    """At least 85% of the limit is used whenever the unabridged turn does not fit."""
    root = tmp_path_factory.mktemp("big")
    for i, (sections, words) in enumerate(shapes):
        (root / f"n{i}.md").write_text(_big_note(i, sections, words), encoding="utf-8")
    attach = [note(f"n{i}.md") for i in range(len(shapes))]
    whole = Conversation("You are terse.", vault=root).turn("Compare these.", attach)
    budget = Budget(window, window // 8)
    env = Conversation("You are terse.", vault=root, budget=budget).turn("Compare these.", attach)
    used = exact_request_tokens(env)
    assert used <= budget.limit
    roomy = len(shapes) * MIN_PREVIEW_TOKENS * 2 < budget.limit
    if exact_request_tokens(whole) > budget.limit and roomy:
        assert used >= 0.85 * budget.limit, (used, budget.limit)


def test_a_folder_larger_than_the_window_fits_as_an_index(tmp_path: Path) -> None:
    """800 generated notes at 32k: the folder collapses into one index artifact within the
    text-free share (3,200 tokens), which counts what is not sent: the room goes to 464
    members' previews, none to index lines (with each member's share of the index head
    rounded up, the solve counted 800 tokens of heads and sent two lines and a preview
    less; with the head shared by all 800, the previews' shares were never sent, and the
    rounds crept to 465 previews 6 tokens under the room, where the head is now fixed once
    a round sends it and the next round lands 21 under, a preview being some 57)."""
    for i in range(800):
        (tmp_path / "notes").mkdir(exist_ok=True)
        (tmp_path / "notes" / f"n{i:03d}.md").write_text(_big_note(i, 2, 60), encoding="utf-8")
    conv = Conversation("You are terse.", vault=tmp_path, budget=Budget(32_000, 4_000))
    env = conv.turn("What is in these notes?", [folder("notes")])
    check_envelope(env)
    index = [s for s in env.l3.segments if s.source_type == "index"]
    assert len(index) == 1 and index[0].tokens <= 3_200
    lines = [x for x in index[0].text.split("\n") if x.startswith("- note:notes/")]
    sent = [s for s in env.l3.segments if s.key.startswith("note:notes/")]
    counted = 800 - len(lines) - len(sent)
    assert len(sent) == 464 and not lines
    assert index[0].attributes == (("items", str(800 - len(sent))),)
    assert f"\n{counted} items of folder:notes were attached but not sent" in index[0].text
    assert exact_request_tokens(env) <= 28_000
    decisions = [d for d in env.report.budget.decisions if d.to_form == "index"]
    assert [d.target for d in decisions] == ["folder:notes"]


@pytest.mark.parametrize("window", [4000, 16000])
def test_the_first_solve_of_a_large_folder_counts_its_request_closely(
    window: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """400 notes attached as one folder: the rungs count each block as the request frames
    it and split the folder index's head over its members in shares that sum to it, so
    the first solve's count of its request (the room's target less the room, plus the
    tokens it chose) is within 100 tokens of the request measured. (A separator counted
    as two tokens and each member's share of the head rounded up: 235 to 402 over.)"""
    import lamina.pipeline._budget.objective as objective
    from lamina.pipeline._turn.draft import Draft
    from lamina.pipeline._turn.graph import TurnGraph

    first: list[tuple[int, int]] = []
    drafts: list[Draft] = []
    solve, draft = objective.solve, objective.draft

    def solving(ladders: Any, room: int, **kw: Any) -> Any:
        solution = solve(ladders, room, **kw)
        if solution is not None:
            first.append((room, solution.tokens))
        return solution

    def drafting(turn: TurnGraph, previous: Draft | None = None) -> Draft:
        drafts.append(draft(turn, previous))
        return drafts[-1]

    monkeypatch.setattr(objective, "solve", solving)
    monkeypatch.setattr(objective, "draft", drafting)
    (tmp_path / "notes").mkdir()
    for i in range(400):
        (tmp_path / "notes" / f"n{i:03d}.md").write_text(_big_note(i, 3, 80), encoding="utf-8")
    budget = Budget(window, window // 8)
    conv = Conversation("You are terse.", vault=tmp_path, budget=budget)
    conv.turn("What is in these notes?", [folder("notes")])
    room, tokens = first[0]
    target = budget.limit - math.floor(budget.limit * budget.headroom)
    measured = budget.used(drafts[1], conv.counter)  # drafts[0]: the request as built
    assert abs(measured - (target - room + tokens)) < 100


def _calls(monkeypatch: pytest.MonkeyPatch, module: Any, name: str) -> list[int]:
    """The calls to ``module.name`` this test makes from now on, one entry each."""
    counted: list[int] = []
    original = getattr(module, name)

    def counting(*args: Any, **kw: Any) -> Any:
        counted.append(1)
        return original(*args, **kw)

    monkeypatch.setattr(module, name, counting)
    return counted


@pytest.fixture
def solves(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The budget stage's solves this test makes, one entry each."""
    import lamina.pipeline._budget.objective as objective

    return _calls(monkeypatch, objective, "solve")


def test_previews_over_their_guess_are_made_together(tmp_path: Path, solves: list[int]) -> None:
    """300 notes with properties under a deep path, attached as one folder at 16k: a
    preview's floor (its block's opening with the long key and title, the properties)
    measures more than the preview's limit, its guess. The solve takes the guessed previews
    at the room's edge one at a time; the first that measures over its guess makes the
    next guessed rung of every unit, so the turn solves a few times (131 times when each
    was made alone) and fills its room the same."""
    where = tmp_path / "notes" / "Compendium" / "SF1E" / "Items" / "Armaments" / "Grenades"
    where.mkdir(parents=True)
    for i in range(300):
        props = "\n".join(f"prop{k}: value {i} {k} alpha beta" for k in range(6))
        body = " ".join(f"word{i}x{k}" for k in range(60))
        text = f"---\n{props}\n---\n\n# Item {i} of the catalogue\n\n{body}.\n"
        text += f"\n## Details\n\n{body}.\n\n## More\n\n{body}.\n"
        (where / f"Item number {i:03d} of the catalogue of things.md").write_text(text)
    budget = Budget(16_000, 2_000)
    env = Conversation("You are terse.", vault=tmp_path, budget=budget).turn(
        "What is in these notes?", [folder("notes")]
    )
    assert len(solves) <= 12
    assert env.report.budget is not None and env.report.budget.used >= 0.94 * budget.limit


def test_previews_under_their_guess_are_not_chased_a_solve_each(
    tmp_path: Path, solves: list[int]
) -> None:
    """The benchmark's 800-note folder at 64k: the previews the first solves take measure
    a few tokens under their guesses, and each solve after spent what they freed on one
    more guess (20 solves). What they free under a thousandth of the room goes to the
    exact forms it can take, without solving again: 10 solves, the room filled the same."""
    budget = Budget(64_000, 8_000)
    env = _benchmark_folder_turn(tmp_path, 800, budget)
    assert len(solves) <= 12
    assert env.report.budget is not None and env.report.budget.used >= 0.94 * budget.limit


def test_a_round_draws_again_only_the_blocks_it_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same folder turn: each round's draft makes again only the item blocks whose
    placement changed since the last round's (the request as built was drafted once):
    1,591 item views, where drafting each round against the request as built made 5,486."""
    import lamina.pipeline._turn.assemble as assemble

    views = _calls(monkeypatch, assemble, "item_view")
    budget = Budget(64_000, 8_000)
    env = _benchmark_folder_turn(tmp_path, 800, budget)
    assert len(views) <= 2_000
    assert env.report.budget is not None and env.report.budget.used >= 0.94 * budget.limit


def _benchmark_folder_turn(root: Path, notes: int, budget: Budget) -> Envelope:
    """One turn attaching ``benchmarks/budget_fit.py``'s folder of ``notes`` notes."""
    from benchmarks.budget_fit import SEED, folder_workload
    from benchmarks.workload import Workload, write_vault

    write_vault(Workload("folder", folder_workload(SEED, notes), (), ()), root)
    return Conversation("You are terse.", vault=root, budget=budget).turn(
        "What do these notes say about the sync protocol?", [folder("folder")]
    )


def test_a_fit_that_takes_a_little_of_the_reserve_gives_back_only_that() -> None:
    """kepano-obsidian's 52 templates at 3,000 (limit 2,400, the reserve its 120-token
    headroom): a round's fit takes a token of the reserve at a room cut by 51 tokens. The
    next room is cut by that token and the usual 8, not by half the cut again as an
    overshoot of the limit is, so the fit leaves 23 tokens beyond the reserve, not 42."""
    vault = Path(__file__).resolve().parents[1] / "data" / "kepano-obsidian"
    budget = Budget(3000, 600)
    conv = Conversation("You answer from the attached notes.", vault=vault, budget=budget)
    env = conv.turn("What are these templates for?", [folder("Templates")])
    target = budget.limit - budget.headroom_tokens
    assert target - 30 <= exact_request_tokens(env) <= target


def test_an_item_cut_to_a_reference_says_it_was_not_sent(tmp_path: Path) -> None:
    for i in range(16):
        (tmp_path / f"n{i}.md").write_text(_big_note(i, 3, 200), encoding="utf-8")
    budget = Budget(900, 100)
    env = Conversation(vault=tmp_path, budget=budget).turn(
        "Read all.", [note(f"n{i}.md") for i in range(16)]
    )
    check_envelope(env)
    unsent = [s for s in env.l3.segments if s.unsent]
    assert unsent and all(s.key not in env.l2.keys() for s in unsent)  # noqa: SIM118
    assert NOT_SENT_INTRO in env.user_text
    if REFERENCES_INTRO in env.user_text:
        listed = env.user_text.split(REFERENCES_INTRO)[1].split(NOT_SENT_INTRO)[0]
        assert all(s.text not in listed for s in unsent)


def test_the_prefix_breaks_rarely_when_nothing_new_is_attached(tmp_path: Path) -> None:
    """Six notes loaded, then 16 questions attaching nothing: history grows every turn, so
    something gives way every few turns. A turn that changes forms leaves the next turn's
    growth free (the reserve), so no two turns in a row break the system message, and
    over the chat the cached prefix keeps at least 80% of its bound (the issue's fixed
    target, ``judge_chat``). (With the library's growth deferred in the first turn's
    message, a cut of history re-sends all of it, so the solve cuts the library's last
    entries instead: 83% of the bound, where cutting history after a settled library
    kept 92%.)"""
    for i in range(6):
        (tmp_path / f"n{i}.md").write_text(_big_note(i, 4, 60), encoding="utf-8")
    conv = Conversation("You are terse.", vault=tmp_path, budget=Budget(5000, 600))
    conv.turn("Load these.", [note(f"n{i}.md") for i in range(6)])
    conv.reply("Loaded.")
    envs = []
    for i in range(16):
        envs.append(conv.turn(f"Question {i} " + "about the notes " * 20))
        conv.reply(f"Answer {i} " + "with reasons " * 40)
    pairs = enumerate(itertools.pairwise(envs))
    breaks = [i for i, (a, b) in pairs if not b.system_text.startswith(a.system_text)]
    assert all(b - a >= 2 for a, b in itertools.pairwise(breaks)), breaks
    assert all(exact_request_tokens(e) <= 4400 for e in envs)
    judged = judge_chat(envs, conv.counter, budget=conv.budget)
    assert judged.cached_of_bound >= 0.8, judged.summary()


def test_a_preview_at_its_smallest_goes_unsent_instead_of_cycling(
    prop_vault: tuple[Path, str],
) -> None:
    """A transcript's preview can be no smaller than its tag and an "omitted" line. Shrinking
    its limit a token a round once looped for ever (the limit ran down to 0, then back to the
    cap), at window 133 among others; each turn now ends in a few cuts."""
    root, _ = prop_vault
    video = {"youtube": "https://youtu.be/dQw4w9WgXcQ", "transcript": "media/talk.vtt"}
    for window in range(100, 400, 3):
        sources = Sources(context=ProcessContext(vault=Vault(root), allow_private_network=True))
        budget = Budget(window, window // 5)
        conv = Conversation("sys", sources=sources, budget=budget)
        done: list[Envelope | None] = []

        def turn(conv: Conversation = conv, done: list[Envelope | None] = done) -> None:
            try:
                done.append(conv.turn("q", [video, {"selection": "a small selection"}]))
            except BudgetExceeded:
                done.append(None)

        worker = threading.Thread(target=turn, daemon=True)
        worker.start()
        worker.join(10)
        assert done, f"window {window}: the budget did not finish in 10 s"
        env = done[0]
        if env is not None:
            assert exact_request_tokens(env) <= budget.limit
            assert len(env.report.decisions) < 20


def test_a_note_many_windows_long_takes_no_more_than_a_window_is_worth(tmp_path: Path) -> None:
    """Four notes in the library, then a note of about 40 windows attached at 4k: its
    whole counts at most the limit in its value, so its preview takes the room of the
    library's last two entries only (each cut to a preview of the preview it holds) and
    the cached prefix keeps its bound's share. (Counted whole, each more token of its
    preview was worth several cached ones: the library from its second entry on was cut
    for a 1,707-token preview, 74% of the bound. Before entries held as previews had
    previews of their own, the last entry went to a stub for a 500-token preview.)"""
    for i in range(4):
        (tmp_path / f"n{i}.md").write_text(_big_note(i, 3, 60), encoding="utf-8")
    (tmp_path / "long.md").write_text(_big_note(99, 300, 100), encoding="utf-8")
    conv = Conversation("You are terse.", vault=tmp_path, budget=Budget(4096, 1024))
    envs = [conv.turn("Load these.", [note(f"n{i}.md") for i in range(4)])]
    conv.reply("Loaded.")
    envs.append(conv.turn("What does the long note say?", [note("long.md")]))
    sent = [(s.key, s.form, s.tokens) for s in envs[0].l3.segments]
    kept = [(s.key, s.form, s.tokens) for s in envs[1].l2.segments]
    assert kept[:2] == sent[:2]  # the library's first two entries as they came
    for (key, form, tokens), (key_sent, _, tokens_sent) in list(zip(kept, sent, strict=True))[2:]:
        assert key == key_sent and form is Form.PREVIEW and tokens < tokens_sent
    (long,) = envs[1].l3.segments
    assert long.form is Form.PREVIEW and long.tokens < 1000
    judged = judge_chat(envs, conv.counter, budget=conv.budget)
    assert judged.cached_of_bound >= 0.8, judged.summary()
