"""Real material: budgeted chats over whole vaults the budget was not tuned on, judged by
``lamina.renderers.judge_chat`` (fixed criteria, the project's targets).

Vaults are given as paths (arguments, or ``LAMINA_VAULTS`` separated by the path list
separator), never committed: the repository holds only ``examples/vault`` and
``tests/data/kepano-obsidian``. For each vault two deterministic chats are derived from its
structure (its largest folders and tags of at most ``MAX_GROUP`` notes, none nested in
another chosen, and its largest notes by bytes; ties broken by path):

- ``mixed`` (16 turns): folders, tags, single large notes, re-attachments of a note, a
  folder and a tag, and turns that only ask;
- ``shifted`` (16 turns, where the vault has more than four folders or tags): the same
  kinds in another order, from the fifth to the eighth largest of each, so each vault and
  window is judged on two chats (one chat's cached share moves by several points with a
  one-token change in an early turn);
- ``folder`` (1 turn): the largest folder alone (its window-use target is 85%, not 90%).

Each runs through ``lamina.Conversation`` with a default ``Budget`` at 4k, 8k, 16k and 32k
(reserve by the CLI's rule, min(4096, window / 4)); a fixed reply of about 80 tokens
follows each turn. Printed per chat and window: window use in the turns that cut, the
cached-prefix share beside its bound and their ratio, turn-entries left cut, the largest
stubs-plus-indexes share, blocks without prose, open frontmatter, requests over the limit,
and the chat's wall time; the targets' misses and the JSON are written too, and the run
is summed up (``summary``: its chats pooled; ``forgone``: the bound's tokens left uncached,
by how each request was sent). ``--compare BEFORE.json AFTER.json`` reads two runs: the
chats whose judged measures moved, both summaries and both forgone sums.

Held out (``HELD_OUT``, by the folder each is checked out as): ``pathfinder2e-srd``
(Obsidian-TTRPG-Community/Pathfinder-2E-SRD-Markdown, 11,181 notes), ``alternef``,
``facultad-apuntes``, ``obsidian-hub``, ``zettel-yoshi`` and ``dendron-site`` are for
final checks only (``logseq-docs`` was, until its mixed chats were traced).
Tune on the others (``obsidianmd/obsidian-help``, 6,280 notes in 34 languages;
``Obsidian-TTRPG-Community/Starfinder-SRD-Markdown``, 5,288 notes with tags),
``examples/vault`` and kepano; run the held-out vaults once a change is done, and
report them apart (the summary pools them apart too; docs/BENCHMARKS.md lists them all).

Run: ``python -m benchmarks.real_material path/to/obsidian-help --out real.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

__all__ = [
    "HELD_OUT",
    "MAX_GROUP",
    "WINDOWS",
    "Chat",
    "VaultShape",
    "chats",
    "compare",
    "forgone",
    "full_sizes",
    "judge_vault_chat",
    "main",
    "measure",
    "summary",
    "vault_shape",
]

WINDOWS = (4_096, 8_192, 16_384, 32_768)
MAX_GROUP = 600
"""The most notes a chosen folder or tag holds (the issue's chats attach 400-600)."""
HELD_OUT = (
    *("pathfinder2e-srd", "alternef", "facultad-apuntes", "obsidian-hub", "zettel-yoshi"),
    "dendron-site",
)
"""Vault folder names held out for final checks (see the module docstring)."""
SYSTEM = "You answer from the attached notes."
REPLY = "the notes say several things about this. " * 8
FOLDER_USE = 0.85
"""The window-use target of the single large-folder chat (the project's target)."""

Attach = dict[str, str]


@attrs.frozen
class Chat:
    """A named chat script: (query, attachments) per turn."""

    name: str
    turns: tuple[tuple[str, tuple[Attach, ...]], ...]


@attrs.frozen
class VaultShape:
    """What a chat is derived from: the vault's largest folders, tags and notes."""

    notes: int
    folders: tuple[tuple[str, int], ...]
    tags: tuple[tuple[str, int], ...]
    largest: tuple[tuple[str, int], ...]


def _groups(counts: Counter[str], take: int) -> tuple[tuple[str, int], ...]:
    """The ``take`` largest groups of at most ``MAX_GROUP`` notes, none nested in (or
    holding) one already chosen, largest first, ties by name."""
    chosen: list[tuple[str, int]] = []
    for name, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        if n > MAX_GROUP or n < 2:
            continue
        if any(name.startswith(c + "/") or c.startswith(name + "/") for c, _ in chosen):
            continue
        chosen.append((name, n))
        if len(chosen) == take:
            break
    return tuple(chosen)


def vault_shape(root: Path, take: int = 8) -> VaultShape:
    """The ``take`` largest folders and tags (notes below them, nested tags included, as
    ``{"tag": ...}`` matches) and largest notes of the vault at ``root``."""
    from lamina.processors._notes import parse_note

    paths = sorted(
        p.relative_to(root).as_posix()
        for p in root.rglob("*.md")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts)
    )
    folders: Counter[str] = Counter()
    tags: Counter[str] = Counter()
    sizes: list[tuple[str, int]] = []
    for rel in paths:
        data = (root / rel).read_bytes()
        sizes.append((rel, len(data)))
        parts = rel.split("/")[:-1]
        folders.update("/".join(parts[: i + 1]) for i in range(len(parts)))
        payload, _ = parse_note(rel, data.decode("utf-8", errors="replace"))
        names = {
            "/".join(t.split("/")[: i + 1]) for t in payload.tags for i in range(t.count("/") + 1)
        }
        tags.update(names)
    largest = tuple(sorted(sizes, key=lambda s: (-s[1], s[0]))[:take])
    return VaultShape(len(paths), _groups(folders, take), _groups(tags, take), largest)


def chats(shape: VaultShape) -> tuple[Chat, ...]:
    """The ``mixed`` chat, the ``shifted`` chat where the vault has more than four folders
    or tags, and, when it has a folder, the ``folder`` chat."""
    folders = [{"folder": f} for f, _ in shape.folders]
    tags = [{"tag": t} for t, _ in shape.tags]
    notes = [{"note": n} for n, _ in shape.largest]

    def at(items: list[Attach], i: int) -> tuple[Attach, ...]:
        return (items[i],) if i < len(items) else ()

    plan = [
        at(folders, 0), at(notes, 0), at(tags, 0), (),
        at(folders, 1), at(notes, 1), at(notes, 0), at(tags, 1),
        (), at(folders, 2), at(folders, 1), at(notes, 2),
        at(tags, 2), at(tags, 0), at(folders, 3), (),
    ]  # fmt: skip
    shifted = [
        at(notes, 4), at(folders, 4), (), at(tags, 4),
        at(notes, 5), at(folders, 5), at(tags, 5), at(notes, 4),
        at(folders, 6), (), at(tags, 6), at(notes, 6),
        at(folders, 4), at(notes, 7), at(tags, 7), (),
    ]  # fmt: skip
    out = [_chat("mixed", plan)]
    if len(folders) > 4 or len(tags) > 4:
        out.append(_chat("shifted", shifted))
    if folders:
        folder = folders[0]
        out.append(Chat("folder", ((f"Question 1: what do {_label((folder,))} say?", (folder,)),)))
    return tuple(out)


def _chat(name: str, plan: Sequence[tuple[Attach, ...]]) -> Chat:
    return Chat(
        name,
        tuple((f"Question {i + 1}: what do {_label(a)} say?", a) for i, a in enumerate(plan)),
    )


def _label(attach: tuple[Attach, ...]) -> str:
    if not attach:
        return "the notes so far"
    ((kind, value),) = attach[0].items()
    return f"the notes of {kind} {value}"


def full_sizes(vault: Path, envelopes: Sequence[Any]) -> dict[str, int]:
    """The tokens of the full block of every note the chat shows cut, from one unbudgeted
    turn attaching them all (the judge knows a full size otherwise only when the chat
    showed the note whole; a folder's notes may never be)."""
    from lamina import Conversation
    from lamina.pipeline import Form

    keys = sorted(
        {
            s.key
            for env in envelopes
            for s in (*env.l2.segments, *env.l3.segments)
            if s.form is not Form.FULL and s.key.startswith("note:") and "#" not in s.key
        }
    )
    if not keys:
        return {}
    env = Conversation(SYSTEM, vault=vault).turn("sizes", [{"note": k[5:]} for k in keys])
    return {s.key: s.tokens for s in env.l3.segments if s.form is Form.FULL}


def judge_vault_chat(vault: Path, chat: Chat, window: int) -> dict[str, Any]:
    """One chat at one window: the judgement's measures, its findings' counts and time."""
    from lamina import Conversation
    from lamina.pipeline import Budget
    from lamina.renderers import ChatTargets, judge_chat

    budget = Budget(context_window=window, reserve_output=min(4096, window // 4))
    conv = Conversation(SYSTEM, vault=vault, budget=budget)
    start = time.perf_counter()
    envs = []
    for i, (query, attach) in enumerate(chat.turns):
        envs.append(conv.turn(query, list(attach)))
        conv.reply(f"Answer {i + 1}: {REPLY}")
    seconds = time.perf_counter() - start
    sizes = full_sizes(vault, envs)
    j = judge_chat(envs, conv.counter, budget=conv.budget, full_sizes=sizes)
    targets = ChatTargets(window_use=FOLDER_USE) if chat.name == "folder" else ChatTargets()
    return {
        "chat": chat.name,
        "window": window,
        "turns": j.turns,
        "cut_turns": j.cut_turns,
        "window_use": round(j.window_use, 4),
        "cached_share": round(j.cached_share, 4),
        "cached_bound": round(j.cached_bound, 4),
        "cached_of_bound": round(j.cached_of_bound, 4),
        "left_cut": j.count("left-cut"),
        "text_free_share": round(j.text_free_share, 4),
        "attached_share": round(j.attached_share, 4),
        "no_prose": j.count("no-prose"),
        "open_frontmatter": j.count("open-frontmatter"),
        "over_limit": j.count("over-limit"),
        "stub_reference": j.count("stub-reference"),
        "input_tokens": j.input_tokens,
        "cached_tokens": j.cached_tokens,
        "bound_tokens": j.bound_tokens,
        "forgone": dict(j.forgone),
        "seconds": round(seconds, 2),
        "misses": list(j.misses(targets)),
    }


_COLUMNS = (
    ("chat", "chat", "{}"),
    ("window", "window", "{}"),
    ("cut", "cut_turns", "{}"),
    ("use", "window_use", "{:.1%}"),
    ("cached", "cached_share", "{:.1%}"),
    ("bound", "cached_bound", "{:.1%}"),
    ("c/b", "cached_of_bound", "{:.0%}"),
    ("left", "left_cut", "{}"),
    ("stub+idx", "text_free_share", "{:.1%}"),
    ("attached", "attached_share", "{:.1%}"),
    ("noprose", "no_prose", "{}"),
    ("openfm", "open_frontmatter", "{}"),
    ("over", "over_limit", "{}"),
    ("s", "seconds", "{:.1f}"),
)


def table(rows: Sequence[dict[str, Any]]) -> str:
    """The rows as a fixed-width table, one line per chat and window."""
    cells = [[h for h, _, _ in _COLUMNS]]
    cells += [[fmt.format(r[k]) for _, k, fmt in _COLUMNS] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(_COLUMNS))]
    return "\n".join(
        "  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in cells
    )


def measure(
    vaults: Sequence[Path], windows: Sequence[int] = WINDOWS, names: Sequence[str] = ()
) -> dict[str, Any]:
    """Every vault's chats (``names``: only those) at every window, printed as they run."""
    doc: dict[str, Any] = {"windows": list(windows), "vaults": []}
    for vault in vaults:
        shape = vault_shape(vault)
        rows = []
        for chat in chats(shape):
            if names and chat.name not in names:
                continue
            for window in windows:
                rows.append(judge_vault_chat(vault, chat, window))
        held = vault.name in HELD_OUT
        print(f"\n{vault.name}{' (held out)' if held else ''}: {shape.notes:,} notes")
        print(table(rows), flush=True)
        doc["vaults"].append(
            {"vault": vault.name, "held_out": held, "shape": attrs.asdict(shape), "rows": rows}
        )
    return doc


def summary(doc: Mapping[str, Any]) -> dict[str, Any]:
    """A run in a few figures: its chats, those with a cache measure (a bound above 0) and
    how many of them meet the cached target, their cached tokens over their bounds
    (pooled: one chat's ratio moves by points with a few tokens changed in an early turn,
    so a change is judged on all of them), and the chats missing any target; the same
    measures for the held-out vaults alone (``held_out_...``), where the run has any."""
    rows = [r for v in doc["vaults"] for r in v["rows"]]
    out = {"chats": len(rows), **_pooled(rows), "missing": sum(bool(r["misses"]) for r in rows)}
    held = [r for v in doc["vaults"] if v.get("held_out") for r in v["rows"]]
    if held:
        out.update({f"held_out_{key}": value for key, value in _pooled(held).items()})
    return out


def _pooled(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """``rows``' chats with a cache measure, how many meet the cached target, and their
    cached tokens over their bounds, pooled."""
    from lamina.renderers import ChatTargets

    target = ChatTargets().cached_of_bound
    cached = [r for r in rows if _tokens(r, "bound") > 0]
    bound = sum(_tokens(r, "bound") for r in cached)
    return {
        "cached_chats": len(cached),
        "cached_met": sum(r["cached_of_bound"] >= target for r in cached),
        "pooled_cached_of_bound": round(sum(_tokens(r, "cached") for r in cached) / bound, 4)
        if bound
        else None,
    }


def forgone(doc: Mapping[str, Any]) -> dict[str, int]:
    """The bound's tokens a run's chats left uncached, pooled by how each request was
    sent (``ChatJudgement.forgone``), the largest first; rows written before it was kept
    add nothing."""
    by: Counter[str] = Counter()
    for vault in doc["vaults"]:
        for row in vault["rows"]:
            by.update(row.get("forgone", {}))
    return dict(sorted(by.items(), key=lambda kv: (-kv[1], kv[0])))


def _forgone_line(name: str, doc: Mapping[str, Any]) -> list[str]:
    by = forgone(doc)
    return [f"{name} forgone: " + ", ".join(f"{k} {v}" for k, v in by.items())] if by else []


def _tokens(row: Mapping[str, Any], kind: str) -> int:
    """A row's cached or bound tokens (from its shares in a run written before they were)."""
    if f"{kind}_tokens" in row:
        return int(row[f"{kind}_tokens"])
    share = row["cached_share"] if kind == "cached" else row["cached_bound"]
    return round(float(share) * int(row["input_tokens"]))


_COMPARED = ("cached_of_bound", "window_use", "left_cut", "text_free_share", "over_limit")


def compare(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[str]:
    """The chats two runs both hold whose judged measures differ, a line each, then each
    run's ``summary``: what a change to the budget did, read over every chat."""
    old = {(v["vault"], r["chat"], r["window"]): r for v in before["vaults"] for r in v["rows"]}
    lines = []
    for vault in after["vaults"]:
        for row in vault["rows"]:
            was = old.get((vault["vault"], row["chat"], row["window"]))
            if was is None or all(was[k] == row[k] for k in _COMPARED):
                continue
            moved = ", ".join(f"{k} {was[k]} -> {row[k]}" for k in _COMPARED if was[k] != row[k])
            lines.append(f"{vault['vault']} {row['chat']} {row['window']}: {moved}")
    for name, doc in (("before", before), ("after", after)):
        lines.append(f"{name}: " + ", ".join(f"{k} {v}" for k, v in summary(doc).items()))
    for name, doc in (("before", before), ("after", after)):
        lines += _forgone_line(name, doc)
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m benchmarks.real_material VAULT... [--windows 4096,8192] [--out F]``, or
    ``--compare BEFORE.json AFTER.json`` (two runs' ``--out``)."""
    parser = argparse.ArgumentParser(prog="benchmarks.real_material")
    parser.add_argument("vaults", nargs="*", type=Path)
    parser.add_argument("--windows", default=",".join(str(w) for w in WINDOWS))
    parser.add_argument("--chats", default="", help="comma-separated chat names (default all)")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    args = parser.parse_args(argv)
    if args.compare is not None:
        before, after = (json.loads(p.read_text(encoding="utf-8")) for p in args.compare)
        print("\n".join(compare(before, after)))
        return 0
    vaults = args.vaults or [
        Path(p) for p in os.environ.get("LAMINA_VAULTS", "").split(os.pathsep) if p
    ]
    if not vaults:
        parser.error("give vault paths or set LAMINA_VAULTS")
    windows = [int(w) for w in args.windows.split(",") if w]
    doc = measure(vaults, windows, [c for c in args.chats.split(",") if c])
    doc["summary"] = summary(doc)
    print("\n" + ", ".join(f"{k} {v}" for k, v in doc["summary"].items()))
    print("\n".join(_forgone_line("run", doc)))
    if args.out is not None:
        args.out.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
