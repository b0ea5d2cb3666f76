"""How close the budget's greedy comes to the best choice, on the solves of real chats.

Every solve a chat makes (``objective.solve``: the turn's ladders, its room, the cache
price, the text-free share, the regret, what the batch carries) is recorded as the chat
runs. Afterwards the ladders left free by the break the greedy chose are solved exactly:
a dynamic program over tokens (the multiple-choice knapsack, with numpy), the prefix
before the break kept as last turn sent it and each rung valued less the cache price of
what it re-sends where the objective prices it. Both choices are scored by the same
``solver.scored``; the exact one is the baseline, measured in the same run.

Left out, and counted: solves whose choice the regret bought or that weigh what a batch
carries (their objective has terms the program does not hold), and those whose exact
choice is over the text-free share (the program does not bound it). The exact choice is
the best for the greedy's break among the choices that change no block before it;
another break might do better still, so the gap is a lower bound.

Reported per chat and window: the solves and those compared, how many the exact choice
betters by more than 0.1% and 1% of its objective, the mean gap and the worst; and how
many the greedy betters (none can: the program values the greedy's own choice as the
objective does, and any other at most so, so this counts a program gone wrong).

Run: ``python -m benchmarks.solver_gap [VAULT...] [--windows 4096,8192] [--out gap.json]``
(the repository's kepano vault when none is given; the chats are
``benchmarks.real_material``'s).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs

__all__ = ["Recorded", "exact_choice", "gap_rows", "main", "recorded_solves"]

KEPANO = Path(__file__).resolve().parents[1] / "tests" / "data" / "kepano-obsidian"
WINDOWS = (4_096, 8_192)
MAX_ROOM = 40_000
"""The largest room the program solves (its table holds a row of this many per ladder)."""


@attrs.frozen
class Recorded:
    """One solve as the budget called it, and the greedy's answer."""

    ladders: tuple[Any, ...]
    room: int
    cache_price: float
    text_free: int
    regret: float
    carried: Any
    solution: Any


@contextmanager
def recorded_solves() -> Iterator[list[Recorded]]:
    """Every ``solve`` the budget stage makes inside the block, recorded in order."""
    from lamina.pipeline._budget import objective

    solves: list[Recorded] = []
    names = vars(objective)  # the stage calls the solver by this module's name for it
    real = names["solve"]

    def recording(ladders: Sequence[Any], room: int, **kwargs: Any) -> Any:
        done = real(ladders, room, **kwargs)
        solves.append(
            Recorded(
                tuple(ladders),
                room,
                kwargs.get("cache_price", 0.0),
                kwargs.get("text_free", 0),
                kwargs.get("regret", 0.0),
                kwargs.get("carried"),
                done,
            )
        )
        return done

    names["solve"] = recording
    try:
        yield solves
    finally:
        names["solve"] = real


def exact_choice(solve: Recorded) -> tuple[int, ...] | None:
    """The best choice for the greedy's break (None where the program does not apply)."""
    import numpy as np

    from lamina.pipeline._budget.solver import _latest, _resent

    ladders, done = solve.ladders, solve.solution
    if done is None or done.bought or solve.carried is not None:
        return None
    prefix = [j for j, ladder in enumerate(ladders) if ladder.previous is not None]
    b = len(prefix) if done.broken_at is None else prefix.index(done.broken_at)
    held = set(prefix[:b])
    priced = set(prefix[b : _latest(ladders, prefix, solve.room)])
    choice = [ladder.previous if j in held else 0 for j, ladder in enumerate(ladders)]
    room = solve.room - sum(ladders[j].rungs[choice[j]].tokens for j in held)
    free = [j for j in range(len(ladders)) if j not in held]
    if room < 0 or room > MAX_ROOM:
        return None
    lowest = -1e30
    best = np.zeros(room + 1)  # the most value within t tokens, over the ladders so far
    picks = []
    for j in free:
        ladder = ladders[j]
        price = solve.cache_price if j in priced else 0.0
        row = np.full(room + 1, lowest)
        pick = np.full(room + 1, -1, dtype=np.int32)
        for i, rung in enumerate(ladder.rungs):
            if rung.tokens > room or (rung.at is not None and rung.at < b and i != ladder.previous):
                continue  # over the room, or changing a block before the break (``_score``)
            value = rung.value - price * _resent(ladder, i)
            moved = best[: room + 1 - rung.tokens] + value
            better = moved > row[rung.tokens :]
            row[rung.tokens :] = np.where(better, moved, row[rung.tokens :])
            pick[rung.tokens :] = np.where(better, i, pick[rung.tokens :])
        best = row
        picks.append(pick)
    t = int(np.argmax(best))
    if best[t] <= lowest / 2:
        return None
    for j, pick in zip(reversed(free), reversed(picks), strict=True):
        choice[j] = int(pick[t])
        t -= ladders[j].rungs[choice[j]].tokens
    bare = sum(
        ladder.rungs[c].tokens
        for ladder, c in zip(ladders, choice, strict=True)
        if ladder.rungs[c].text_free
    )
    return tuple(choice) if bare <= solve.text_free else None


def _gaps(solves: Sequence[Recorded]) -> dict[str, Any]:
    """The solves' gaps: the exact choice's objective less the greedy's, over the exact
    one's size (at least 1)."""
    from lamina.pipeline._budget.solver import scored

    gaps: list[float] = []
    for solve in solves:
        choice = exact_choice(solve)
        if choice is None:
            continue
        ours = scored(solve.ladders, solve.solution.choice, solve.cache_price, solve.room).objective
        theirs = scored(solve.ladders, choice, solve.cache_price, solve.room).objective
        gaps.append((theirs - ours) / max(1.0, abs(theirs)))
    return {
        "solves": len(solves),
        "compared": len(gaps),
        "exact_better_0_1pct": sum(g > 0.001 for g in gaps),
        "exact_better_1pct": sum(g > 0.01 for g in gaps),
        # None: the program values the greedy's choice as the objective does (a check).
        "greedy_better_0_1pct": sum(g < -0.001 for g in gaps),
        "mean_gap": round(sum(max(0.0, g) for g in gaps) / max(1, len(gaps)), 5),
        "max_gap": round(max(gaps, default=0.0), 5),
    }


def gap_rows(vault: Path, windows: Sequence[int] = WINDOWS) -> list[dict[str, Any]]:
    """Each chat of ``vault`` (but the one-turn folder chat) at each window, its gaps."""
    from benchmarks.real_material import REPLY, SYSTEM, chats, vault_shape
    from lamina import Conversation
    from lamina.pipeline import Budget

    rows = []
    for chat in chats(vault_shape(vault)):
        if chat.name == "folder":
            continue
        for window in windows:
            budget = Budget(context_window=window, reserve_output=min(4096, window // 4))
            conv = Conversation(SYSTEM, vault=vault, budget=budget)
            with recorded_solves() as solves:
                for i, (query, attach) in enumerate(chat.turns):
                    conv.turn(query, list(attach))
                    conv.reply(f"Answer {i + 1}: {REPLY}")
            rows.append({"vault": vault.name, "chat": chat.name, "window": window,
                         **_gaps(solves)})  # fmt: skip
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.solver_gap")
    parser.add_argument("vaults", nargs="*", type=Path)
    parser.add_argument("--windows", default=",".join(map(str, WINDOWS)))
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    windows = [int(w) for w in args.windows.split(",")]
    rows = [row for vault in args.vaults or [KEPANO] for row in gap_rows(vault, windows)]
    for row in rows:
        print(json.dumps(row))
    if args.out:
        Path(args.out).write_text(json.dumps({"rows": rows}, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
