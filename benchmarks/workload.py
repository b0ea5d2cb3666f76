"""Seeded benchmark workloads: markdown notes, conversations and library scale points.

Everything is generated from a seed with ``random.Random``, so two runs build the same
bytes. Notes look like real vault notes (headings, paragraphs, lists, code, wikilinks)
with sizes spread log-uniformly from 1 KB to 50 KB.
"""

from __future__ import annotations

import math
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "SCALES",
    "Scale",
    "Turn",
    "Workload",
    "cold_workload",
    "conversation_workload",
    "library_workload",
    "make_note",
    "write_vault",
]

_PROSE = (
    "the of and to in is that for it as with was on be by this are from at or an have not "
    "which but all can were when there more one their if will about would each what so up "
    "out them other into has some could time these two may then first any new like our "
    "only over also after use most where through back much before must good well should "
    "because each those people system data sync client server request token cache layer "
    "prompt budget library history query note vault folder tag page section heading list "
    "index offline conflict version device session user member role project milestone "
    "review design decision protocol push pull snapshot interval audit event queue worker "
    "retry timeout error status config option default value field record table schema "
    "migration backup restore upload download photo image file path key hash window model "
    "reply context summary preview excerpt reference stable mutable order policy release "
    "deploy build test bench metric latency memory thread process batch stream buffer"
)
_WORDS = _PROSE.split()
_HEADINGS = (
    "Overview",
    "Goals",
    "Design",
    "Data model",
    "Protocol",
    "Open questions",
    "Decisions",
    "Timeline",
    "Risks",
    "API",
    "Examples",
    "Testing",
    "Rollout",
    "Notes",
    "Background",
    "Error handling",
    "Performance",
    "Security",
    "Glossary",
    "Follow-ups",
)
_CODE = (
    "def sync(client, since):\n    changes = client.pull(since)\n    for change in changes:\n"
    "        apply(change)\n    return client.push(pending())\n",
    "async function refresh(token) {\n  const res = await fetch('/auth/refresh', {\n"
    "    method: 'POST', body: JSON.stringify({ token }),\n  });\n  return res.json();\n}\n",
    "SELECT id, updated_at FROM notes\nWHERE vault_id = ? AND updated_at > ?\n"
    "ORDER BY updated_at LIMIT 500;\n",
    "retry:\n  attempts: 5\n  backoff: exponential\n  max_delay_s: 30\nsnapshot_interval: 6h\n",
)


def _sentence(rng: random.Random) -> str:
    words = [rng.choice(_WORDS) for _ in range(rng.randint(6, 18))]
    if rng.random() < 0.15:
        words.insert(rng.randrange(len(words)), f"`{rng.choice(_WORDS)}_{rng.randint(1, 99)}`")
    if rng.random() < 0.1:
        words.append(f"({rng.randint(2, 999)} ms)")
    return " ".join(words).capitalize() + "."


def _paragraph(rng: random.Random) -> str:
    return " ".join(_sentence(rng) for _ in range(rng.randint(2, 6)))


def _block(rng: random.Random, links: tuple[str, ...]) -> str:
    roll = rng.random()
    if roll < 0.55:
        text = _paragraph(rng)
        if links and rng.random() < 0.1:
            text += f" See [[{rng.choice(links)}]]."
        return text
    if roll < 0.8:
        marker = "-" if rng.random() < 0.6 else "1."
        return "\n".join(f"{marker} {_sentence(rng)}" for _ in range(rng.randint(3, 7)))
    if roll < 0.92:
        lang = rng.choice(("python", "js", "sql", "yaml"))
        return f"```{lang}\n{rng.choice(_CODE)}```"
    return "> " + _sentence(rng)


def make_note(rng: random.Random, size: int, title: str, links: tuple[str, ...] = ()) -> str:
    """A markdown note of about ``size`` bytes: ``#`` title, ``##`` sections, mixed blocks."""
    parts = [f"# {title}", _paragraph(rng)]
    length = sum(len(p) + 2 for p in parts)
    while length < size:
        heading = f"## {rng.choice(_HEADINGS)} {rng.randint(1, 9)}"
        section = [heading] + [_block(rng, links) for _ in range(rng.randint(2, 5))]
        if rng.random() < 0.2:
            section.insert(2, f"### {rng.choice(_HEADINGS)}")
        for block in section:
            parts.append(block)
            length += len(block) + 2
    return "\n\n".join(parts) + "\n"


def _size(rng: random.Random, low: int = 1_000, high: int = 50_000) -> int:
    """A size drawn log-uniformly from [low, high] bytes."""
    return int(math.exp(rng.uniform(math.log(low), math.log(high))))


@dataclass(frozen=True)
class Turn:
    """One scripted turn: the query, what it attaches (vault paths), the reply."""

    query: str
    attach: tuple[str, ...]
    new: tuple[str, ...]
    reply: str


@dataclass(frozen=True)
class Workload:
    """Notes by vault path, the library preloaded into L2 (paths), and the timed turns."""

    name: str
    notes: dict[str, str]
    library: tuple[str, ...]
    turns: tuple[Turn, ...]

    @property
    def note_bytes(self) -> int:
        return sum(len(t.encode()) for t in self.notes.values())


def _query(rng: random.Random, i: int) -> str:
    topic = " ".join(rng.choice(_WORDS) for _ in range(3))
    return f"Turn {i}: what do the attached notes say about {topic}?"


def _reply(rng: random.Random) -> str:
    return " ".join(_sentence(rng) for _ in range(rng.randint(3, 12)))


class _Notes:
    """Hands out fresh note paths with their generated text."""

    def __init__(self, rng: random.Random, prefix: str) -> None:
        self.rng = rng
        self.prefix = prefix
        self.notes: dict[str, str] = {}

    def new(self, size: int | None = None) -> str:
        n = len(self.notes)
        path = f"{self.prefix}/note-{n:04d}.md"
        links = tuple(list(self.notes)[-5:])
        links = tuple(p.removesuffix(".md") for p in links)
        text = make_note(self.rng, size or _size(self.rng), f"Note {n} of {self.prefix}", links)
        self.notes[path] = text
        return path


def library_workload(seed: int, artifacts: int, warm_turns: int) -> Workload:
    """A library of ``artifacts`` notes in L2, then warm turns that each add one new
    10 KB note and re-attach one or two library notes."""
    rng = random.Random(f"{seed}:library:{artifacts}")
    notes = _Notes(rng, "lib")
    library = tuple(notes.new() for _ in range(artifacts))
    turns = []
    for i in range(warm_turns):
        fresh = notes.new(10_000)
        again = tuple(rng.sample(library, k=min(len(library), rng.randint(1, 2))))
        turns.append(Turn(_query(rng, i + 1), (*again, fresh), (fresh,), _reply(rng)))
    return Workload(f"library-{artifacts}", notes.notes, library, tuple(turns))


def conversation_workload(seed: int, turns: int) -> Workload:
    """``turns`` turns; each adds one or two new notes, re-attaches up to two earlier ones
    and drops the rest of the previous turn's attachments."""
    rng = random.Random(f"{seed}:conversation:{turns}")
    notes = _Notes(rng, "chat")
    seen: list[str] = []
    out = []
    for i in range(turns):
        fresh = tuple(notes.new() for _ in range(rng.randint(1, 2)))
        again = tuple(rng.sample(seen, k=min(len(seen), rng.randint(0, 2))))
        seen.extend(fresh)
        out.append(Turn(_query(rng, i + 1), (*again, *fresh), fresh, _reply(rng)))
    return Workload(f"conversation-{turns}", notes.notes, (), tuple(out))


def cold_workload(seed: int, target_bytes: int) -> Workload:
    """One turn attaching notes that add up to about ``target_bytes`` (a cold build)."""
    rng = random.Random(f"{seed}:cold:{target_bytes}")
    notes = _Notes(rng, "cold")
    total = 0
    paths = []
    while total < target_bytes:
        path = notes.new()
        paths.append(path)
        total += len(notes.notes[path])
    turn = Turn(_query(rng, 1), tuple(paths), tuple(paths), _reply(rng))
    return Workload(f"cold-{target_bytes // 1000}KB", notes.notes, (), (turn,))


@dataclass(frozen=True)
class Scale:
    """What one ``--scale`` runs: library sizes, conversation lengths, the cold payload."""

    name: str
    libraries: tuple[int, ...]
    conversations: tuple[int, ...]
    cold_bytes: int
    warm_turns: int
    peer_samples: int
    peer_seconds: float
    requests: int = 5
    request_library: int = 10


SCALES: dict[str, Scale] = {
    "small": Scale("small", (10,), (10,), 200_000, 8, 3, 20.0, 6, 10),
    "medium": Scale("medium", (10, 100), (10, 50), 1_000_000, 15, 4, 60.0, 16, 100),
    "large": Scale("large", (10, 100, 1000), (10, 50, 200), 5_000_000, 20, 4, 120.0, 20, 100),
}


def write_vault(workload: Workload, root: Path) -> None:
    """Write every note of ``workload`` under ``root`` (the conversation's vault).

    Files and folders are dated an hour back, as in a vault nobody edited in the last
    seconds; a folder changed within two seconds is walked again on every turn (Vault).
    """
    for rel, text in workload.notes.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    past = time.time() - 3600
    for folder, _, files in os.walk(root):
        for name in files:
            os.utime(os.path.join(folder, name), (past, past))
        os.utime(folder, (past, past))
