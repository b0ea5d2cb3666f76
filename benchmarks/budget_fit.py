"""Budget fitting at scale and what this turn's attachments keep, on seeded content.

Two measurements, each beside its comparator in the same run:

- ``folder``: one turn attaching a folder of N generated notes under a window; the budget
  stage's time per item, and the budgeted build's time over the same turn without a
  budget (a cost that grows with items shows in the per-item column), built a second
  time: the first build counts every note's tokens, which the builds after it find
  memoized (``no_budget_cold_s``, that first build, was the comparator before 2026-12-06
  and understated the ratio 1.7-3.7 times). Then the
  warm turn: the same turn built again by a new conversation (as a stateless server
  does), with the process's preview memo as it is sized now and, as the comparator, held
  at its old fixed 1,024 entries (``warm_s``, ``warm_fixed_s``, their ratio and hits).
  And the same conversation's next turns: a short question asked as soon as the folder
  turn returned (``next_s``: waiting for the folder's promotion, not for its preparing
  of later turns' summaries), beside the same turn after waiting for all of the
  promotion (``next_waiting_s``, the library read first, as before the preparing
  stopped for a turn), then the p50 of turns alternating a short question and one note
  re-attached, each after its promotion (``warm_turn_p50_s``). And the renderer's memo:
  the warm folder turn by a new conversation and its promotion (which renders again the
  full blocks L3 rendered), with the memo sized to the turn and, as the comparator, held
  at its old fixed 4,096 entries (``promote_s``, ``promote_fixed_s``, their ratio, and
  each one's render memo hits; median of ``RENDER_REPS``, alternating; CPU seconds).
- ``share``: a seeded chat (one or two new notes a turn, some re-attached) under a small
  window; the share of this turn's attachment tokens that reach the model in full or as
  a preview.
"""

from __future__ import annotations

import json
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.workload import Workload, conversation_workload, make_note, write_vault

SEED = 1729
FOLDER_SIZES = {"small": (400,), "medium": (400, 1600), "large": (400, 1600, 6400)}
FOLDER_WINDOWS = (32_000, 200_000)
SHARE_WINDOWS = (8_000, 16_000)
SHARE_TURNS = 18
POLICIES = ("objective",)
"""The budget's one policy, named in each point (the cascade's were compared here before
it was deleted)."""
# The shared preview memo's old fixed size, the warm turn's comparator.
FIXED_MEMO = 1024
# Later turns of the folder's conversation timed for ``warm_turn_p50_s``.
NEXT_TURNS = 6
# The renderer memo's old fixed size, the promotion's comparator, and the runs timed.
FIXED_RENDER_MEMO = 4096
RENDER_REPS = 5


def folder_workload(seed: int, notes: int) -> dict[str, str]:
    """``notes`` generated notes of 0.5-4 KB under ``folder/``."""
    rng = random.Random(f"{seed}:folder:{notes}")
    out: dict[str, str] = {}
    for i in range(notes):
        size = rng.randint(500, 4000)
        out[f"folder/note-{i:05d}.md"] = make_note(rng, size, f"Folder note {i}")
    return out


def _turn(vault: Path, budget: Any) -> tuple[float, float, Any]:
    """(build seconds, budget-stage seconds, envelope) of one turn attaching the folder."""
    from lamina import Conversation

    conv = Conversation("You are terse.", vault=vault, budget=budget)
    start = time.perf_counter()
    env = conv.turn("What do these notes say about the sync protocol?", [{"folder": "folder"}])
    total = time.perf_counter() - start
    stage = dict(env.report.timings).get("budget", 0.0)
    # The promotion (1,600 entries and the ranking of their summaries at 200k) waited for
    # here: left on the one background worker it would run through the next timing.
    _ = conv.library
    return total, stage, env


def _warm(vault: Path, budget: Any, fixed: int | None) -> tuple[float, int]:
    """(seconds, preview memo hits) of the folder turn built again by a new conversation
    after a cold build, the shared memo emptied first and, with ``fixed``, held at that
    many entries (the comparator: the memo before it was sized to the turn)."""
    from lamina.pipeline.views import shared_views

    memo = shared_views()
    size, max_size = memo.size, memo.max_size
    memo.clear()
    if fixed is not None:
        memo.size, memo.max_size = fixed, 0
    try:
        _turn(vault, budget)
        hits = memo.hits
        total, _, _ = _turn(vault, budget)
        return total, memo.hits - hits
    finally:
        memo.size, memo.max_size = size, max_size


def folder_points(scale: str) -> list[dict[str, Any]]:
    """One point per (notes, window, policy): budget time per item and the no-budget ratio."""
    from lamina.pipeline import Budget
    from lamina.pipeline.errors import BudgetExceeded

    points: list[dict[str, Any]] = []
    for n in FOLDER_SIZES[scale]:
        with tempfile.TemporaryDirectory(prefix="lamina-budget-") as tmp:
            vault = Path(tmp)
            write_vault(Workload("folder", folder_workload(SEED, n), (), ()), vault)
            cold, _, _ = _turn(vault, None)
            plain, _, _ = _turn(vault, None)  # as warm as the budgeted builds after it
            for window in FOLDER_WINDOWS:
                for policy in POLICIES:
                    budget = Budget(window, window // 8)
                    point: dict[str, Any] = {
                        "notes": n, "window": window, "policy": policy, "no_budget_s": plain,
                        "no_budget_cold_s": cold,
                    }  # fmt: skip
                    try:
                        total, stage, fitted = _turn(vault, budget)
                    except BudgetExceeded as exc:
                        point["error"] = str(exc).split(" even after")[0]
                    else:
                        report = fitted.report.budget
                        point.update(
                            build_s=total,
                            budget_s=stage,
                            budget_us_per_item=stage / n * 1e6,
                            ratio_to_no_budget=total / plain,
                            used=report.used,
                            limit=report.limit,
                            use=report.used / report.limit,
                            cuts=len(report.decisions),
                            index=any(s.source_type == "index" for s in fitted.l3.segments),
                            **_findable(fitted, n),
                        )
                        if policy == "objective":
                            warm, hits = _warm(vault, budget, None)
                            fixed, fixed_hits = _warm(vault, budget, FIXED_MEMO)
                            point.update(
                                warm_s=warm,
                                warm_ratio_to_cold=warm / total,
                                warm_memo_hits=hits,
                                warm_fixed_s=fixed,
                                warm_fixed_memo_hits=fixed_hits,
                                warm_fixed_ratio_to_warm=fixed / warm,
                                **_next_turns(vault, budget),
                                **_render_memo(vault, budget),
                            )
                    points.append(point)
    return points


def _next_turns(vault: Path, budget: Any) -> dict[str, Any]:
    """The folder's conversation going on: its next turn asked at once, the same turn
    after all of the promotion (a second conversation), and later warm turns."""
    from lamina import Conversation
    from lamina.pipeline.views import summary_pool

    times: dict[bool, float] = {}
    later: list[float] = []
    for wait in (True, False):
        summary_pool().clear()  # the promotion ranks its entries anew (previews stay memoized)
        conv = Conversation("You are terse.", vault=vault, budget=budget)
        conv.turn("What do these notes say about the sync protocol?", [{"folder": "folder"}])
        conv.reply("They say several things about it.")
        start = time.perf_counter()
        if wait:
            _ = conv.library  # the promotion and all of its preparing
        conv.turn("And in short?")
        times[wait] = time.perf_counter() - start
        conv.reply("In short: it syncs.")
        if wait:
            continue
        for i in range(NEXT_TURNS):
            _ = conv.library  # each turn's promotion waited for apart
            attach = [{"note": f"folder/note-{7 * i:05d}.md"}] if i % 2 else []
            start = time.perf_counter()
            conv.turn(f"Question {i}: what else?", attach)
            later.append(time.perf_counter() - start)
            conv.reply(f"Answer {i}.")
    return {
        "next_s": times[False],
        "next_waiting_s": times[True],
        "next_waiting_ratio_to_next": times[True] / times[False],
        "warm_turn_p50_s": statistics.median(later),
    }


def _rendered(vault: Path, budget: Any, fixed: int | None) -> tuple[float, float, int, int]:
    """(turn seconds, promotion seconds, the turn's render memo hits, the promotion's) of
    the folder turn by a new conversation whose renderer's memo is sized to the turn or,
    with ``fixed``, held at that many entries. Seconds of this process's CPU time: a
    promotion's tens of milliseconds drown in wall-clock noise on a shared machine."""
    from lamina import Conversation
    from lamina.pipeline._views.views import renderer_memo

    conv = Conversation("You are terse.", vault=vault, budget=budget)
    memo = renderer_memo(conv.renderer)
    assert memo is not None
    if fixed is not None:
        memo.size, memo.max_size = fixed, 0
    start = time.process_time()
    env = conv.turn(
        "What do these notes say about the sync protocol?", [{"folder": "folder"}], background=False
    )
    turned = time.process_time()
    hits = memo.hits
    _ = conv.library  # the promotion, made here (not its preparing of later summaries)
    promoted = time.process_time()
    turn_hits = dict(env.report.meters)["render_memo_hits"]
    return turned - start, promoted - turned, turn_hits, memo.hits - hits


def _render_memo(vault: Path, budget: Any) -> dict[str, Any]:
    """The warm folder turn and its promotion, the renderer's memo sized to the turn beside
    it held at ``FIXED_RENDER_MEMO`` entries (medians of ``RENDER_REPS`` runs of each,
    alternating which goes first, after one run that leaves the shared memos and summaries
    warm)."""
    _rendered(vault, budget, None)
    runs: dict[bool, list[tuple[float, float, int, int]]] = {True: [], False: []}
    for i in range(RENDER_REPS):
        for fixed in (False, True) if i % 2 else (True, False):
            runs[fixed].append(_rendered(vault, budget, FIXED_RENDER_MEMO if fixed else None))

    def median(fixed: bool, i: int) -> float:
        return statistics.median(run[i] for run in runs[fixed])

    return {
        "render_warm_s": median(False, 0),
        "render_warm_fixed_s": median(True, 0),
        "render_warm_fixed_ratio": median(True, 0) / median(False, 0),
        "render_memo_hits": median(False, 2),
        "render_fixed_memo_hits": median(True, 2),
        "promote_s": median(False, 1),
        "promote_fixed_s": median(True, 1),
        "promote_fixed_ratio": median(True, 1) / median(False, 1),
        "promote_render_hits": median(False, 3),
        "promote_fixed_render_hits": median(True, 3),
    }


def _findable(env: Any, notes: int) -> dict[str, Any]:
    """What the model receives of the folder: notes sent as blocks, notes listed on an
    index line, and the share of the request's tokens in index blocks."""
    from lamina.pipeline import Form

    l3 = env.l3.segments
    sent = sum(1 for s in l3 if s.source_type == "note" and s.form in (Form.FULL, Form.PREVIEW))
    index = [s for s in l3 if s.source_type == "index"]
    listed = sum(1 for s in index for line in s.text.split("\n") if line.startswith("- note:"))
    used = env.report.budget.used
    return {
        "sent": sent,
        "listed": listed,
        "findable": (sent + listed) / notes,
        "index_share": sum(s.tokens for s in index) / used if used else 0.0,
    }


def _attachment_share(conv: Any, workload: Workload) -> dict[str, Any]:
    """Run ``workload``'s turns; share of this turn's attachment tokens sent full/preview."""
    from lamina.pipeline import Form

    counter = conv.counter
    total = kept = 0
    turns_with_nothing = 0
    items = as_reference = 0
    for turn in workload.turns:
        env = conv.turn(turn.query, [{"note": p} for p in turn.attach])
        conv.reply(turn.reply)
        library = {s.key for s in env.l2.segments if s.form is Form.FULL}
        seen = 0
        for path in turn.attach:
            key = f"note:{path}"
            size = counter.count(workload.notes[path])
            seg = env.l3.get(key)
            total += size
            items += 1
            shown = seg is not None and (
                seg.form in (Form.FULL, Form.PREVIEW)
                or (seg.form is Form.REFERENCE and key in library)
            )
            if shown:
                kept += size
                seen += 1
            elif seg is not None and seg.form is Form.REFERENCE:
                as_reference += 1
        turns_with_nothing += seen == 0
    return {
        "attachment_tokens": total,
        "full_or_preview_share": kept / total if total else 1.0,
        "items": items,
        "items_as_reference_only": as_reference,
        "turns_where_nothing_attached_was_seen": turns_with_nothing,
    }


def share_points() -> list[dict[str, Any]]:
    """The seeded chat under each window and policy."""
    from lamina import Conversation
    from lamina.pipeline import Budget

    workload = conversation_workload(SEED, SHARE_TURNS)
    points = []
    with tempfile.TemporaryDirectory(prefix="lamina-share-") as tmp:
        vault = Path(tmp)
        write_vault(workload, vault)
        for window in SHARE_WINDOWS:
            for policy in POLICIES:
                budget = Budget(window, window // 8)
                conv = Conversation("You are terse.", vault=vault, budget=budget)
                point = {"window": window, "policy": policy, "turns": len(workload.turns)}
                point.update(_attachment_share(conv, workload))
                points.append(point)
    return points


def run(scale: str = "small") -> dict[str, Any]:
    """Both measurements as one JSON-ready section."""
    return {"folder": folder_points(scale), "share": share_points()}


def main(scale: str = "small", out: str | None = None) -> None:
    """``lamina bench --budget``: run, print one JSON line per point, write the JSON."""
    doc = {"scale": scale, **run(scale)}
    for section in ("folder", "share"):
        for point in doc[section]:
            print(json.dumps({"section": section, **point}))
    if out is not None:
        from lamina._files import write_atomic  # whole or not at all

        write_atomic(out, json.dumps(doc, indent=2) + "\n")
