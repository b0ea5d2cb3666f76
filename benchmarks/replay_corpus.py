"""A seeded replay corpus: a generated vault and N small recorded conversations.

Conversations mix what production chats have: notes (some large enough to be previewed
in L2), folders and tags, selections, a video transcript, tool results and a recorded
agent loop, replies, and edits to notes between turns (``vault_changes``). Every byte
comes from the seed, so two calls write identical corpora.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from benchmarks.workload import make_note

__all__ = ["CONFIGS", "write_configs", "write_replay_corpus"]

_FOLDERS = ("projects", "meetings", "docs")
_TAGS = ("#sync", "#design", "#ops")
_QUERIES = (
    "Summarize this",
    "What changed since last time?",
    "List the open questions",
    "Which decisions are still pending?",
    "Compare these two notes",
    "What does the team need to do next?",
    "Explain the protocol section",
    "Draft a short status update",
)
_VTT = """WEBVTT

00:00:01.000 --> 00:00:05.000
Today we talk about offline sync and conflicts.

00:00:05.000 --> 00:00:10.000
Every device keeps a queue of operations until the server confirms them.

00:00:10.000 --> 00:00:15.000
Conflicts are kept as two versions until a person resolves them.
"""

# The configs the tests and the benchmark compare: the default policy, and refresh with a
# small budget (so budget decisions and the append-only layout's costs show).
CONFIGS: dict[str, dict[str, Any]] = {
    "pin": {"layout": "default", "freshness": "pin"},
    "tight": {
        "layout": "append-only",
        "freshness": "refresh",
        "reattach": "reference",
        "budget": {"window": 6000, "reserve": 1000},
        "providers": {
            "openai": {"model": "gpt-4.1", "input_per_mtok": 2.0},
            "anthropic": {"model": "claude-sonnet-4-5", "ttl": "1h", "input_per_mtok": 3.0},
        },
    },
}


def _vault(rng: random.Random, root: Path) -> list[str]:
    notes: list[str] = []
    for i in range(24):
        folder = _FOLDERS[i % len(_FOLDERS)]
        path = f"{folder}/note-{i:02d}.md"
        size = 7_000 if i % 8 == 0 else rng.randint(300, 1_500)
        tag = _TAGS[i % len(_TAGS)]
        text = make_note(rng, size, f"Note {i}", links=(f"note-{(i + 1) % 24:02d}",))
        text = text.replace("\n\n", f"\n\n{tag}\n\n", 1)
        (root / folder).mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text, encoding="utf-8")
        notes.append(path)
    (root / "media").mkdir(exist_ok=True)
    (root / "media" / "talk.vtt").write_text(_VTT, encoding="utf-8")
    return notes


def _attachment(rng: random.Random, notes: list[str]) -> dict[str, Any]:
    roll = rng.random()
    if roll < 0.6:
        return {"note": rng.choice(notes)}
    if roll < 0.68:
        return {"folder": rng.choice(_FOLDERS)}
    if roll < 0.74:
        return {"tag": rng.choice(_TAGS)}
    if roll < 0.9:
        words = " ".join(rng.choice(_QUERIES) for _ in range(rng.randint(2, 6)))
        return {"selection": words, "source": rng.choice(notes)}
    return {"youtube": "https://youtu.be/Fb5yncT4lk1", "transcript": "media/talk.vtt"}


def _turn(rng: random.Random, notes: list[str], n: int) -> dict[str, Any]:
    turn: dict[str, Any] = {"user": f"{rng.choice(_QUERIES)} ({n})"}
    attach = [_attachment(rng, notes) for _ in range(rng.randint(0, 2))]
    if attach:
        turn["attach"] = attach
    roll = rng.random()
    if roll < 0.15:
        turn["tools"] = [
            {"name": "search", "args": {"q": f"query {n}"}, "result": f"{rng.randint(1, 9)} hits"}
        ]
    elif roll < 0.22:
        turn["agent"] = [
            {"calls": [{"name": "read", "args": {"page": n}, "result": f"page {n} text"}]}
        ]
    if rng.random() < 0.2:
        path = rng.choice(notes)
        turn["vault_changes"] = {path: f"# Edited {n}\n\nRewritten in turn {n}. #sync\n"}
    if rng.random() < 0.85:
        turn["reply"] = f"Answer {n}: " + " ".join(rng.choice(_QUERIES).lower().split()[:4])
    return turn


def write_replay_corpus(root: Path, conversations: int = 200, seed: int = 20) -> Path:
    """Write ``root/vault`` and ``root/chats/cNNN.json``; returns the chats folder."""
    rng = random.Random(seed)
    notes = _vault(rng, root / "vault")
    chats = root / "chats"
    chats.mkdir(parents=True, exist_ok=True)
    for c in range(conversations):
        script = {
            "system": {"stable": "You are the project assistant.", "mutable": f"User {c % 7}."},
            "vault": "../vault",
            "turns": [_turn(rng, notes, n) for n in range(1, rng.randint(2, 4) + 1)],
        }
        (chats / f"c{c:03d}.json").write_text(json.dumps(script, indent=1), encoding="utf-8")
    return chats


def write_configs(root: Path) -> list[Path]:
    """The ``CONFIGS`` as YAML-compatible JSON files (``root/<name>.json``)."""
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, data in CONFIGS.items():
        path = root / f"{name}.json"
        path.write_text(json.dumps(data, indent=1), encoding="utf-8")
        paths.append(path)
    return paths
