"""What Lamina's timings are compared with: the floor, a naive rebuild, and peer libraries.

``floor`` and ``naive`` run in the benchmark process on the turn Lamina just built. Peers
run each in its own worker subprocess (``python -m benchmarks.comparators PEER``) so their
imports (prompt-poet rewrites ``sys.path``) and ``TIKTOKEN_CACHE_DIR`` (pointing at a temp
copy of Lamina's shipped encodings, so tiktoken never downloads) stay out of Lamina's
process.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import xxhash

__all__ = [
    "NOT_INSTALLED",
    "PEERS",
    "PeerTask",
    "PeerWorker",
    "floor_turn",
    "naive_turn",
    "peer_available",
]

NOT_INSTALLED = "not installed"
ROOT = Path(__file__).resolve().parents[1]

# tiktoken's cache names: sha1 of the download address (shared/tiktoken-encodings/README).
_CACHE_NAMES = {
    "o200k_base": "fb374d419588a4632f3f557e76b4b70aebbca790",
    "cl100k_base": "9b5ad71b2ce5302211f9c61530b329a4922fc6a4",
}

# peer name -> (module that must be importable, what it cannot express)
PEERS: dict[str, tuple[str, str]] = {
    "prompt-poet": (
        "prompt_poet",
        "no references to earlier context, no L2 library (we pass Lamina's L2 texts as "
        "droppable parts), whole parts dropped, no compaction",
    ),
    "priomptipy": (
        "priomptipy",
        "no references, no L2 library (L2 texts passed as scoped parts), no compaction",
    ),
    "langchain-trim_messages": (
        "langchain_core",
        "no references, no L2 library (L2 texts passed as messages), whole messages "
        "dropped oldest first, no compaction",
    ),
}


def floor_turn(encode: Callable[[str], list[int]], new_text: str, parts: Sequence[str]) -> float:
    """Seconds for the least any builder must do: encode only the new bytes, join the final
    request string and hash it (xxh3-128)."""
    start = time.perf_counter()
    encode(new_text)
    joined = "".join(parts)
    xxhash.xxh3_128_hexdigest(joined.encode("utf-8"))
    return time.perf_counter() - start


def naive_turn(
    encode: Callable[[str], list[int]], render: Callable[[], Sequence[str]]
) -> tuple[float, int]:
    """Seconds (and tokens) to re-render everything and count the request from scratch."""
    start = time.perf_counter()
    contents = render()
    tokens = sum(len(encode(c)) for c in contents)
    return time.perf_counter() - start, tokens


@dataclass(frozen=True)
class PeerTask:
    """The same fitting task for every peer: system and query always kept; ``parts`` (oldest
    first: L2 texts, history, this turn's attachments) dropped oldest first to fit ``limit``
    tokens."""

    system: str
    parts: tuple[tuple[str, str], ...]  # (role, text)
    query: str
    limit: int


def peer_available(name: str) -> bool:
    """Whether the peer's package is importable in this interpreter (no import done)."""
    return importlib.util.find_spec(PEERS[name][0]) is not None


def _cache_dir() -> str:
    """A temp dir with Lamina's shipped encodings under tiktoken's cache names."""
    out = tempfile.mkdtemp(prefix="lamina-bench-tiktoken-")
    base = resources.files("lamina.pipeline._tokens") / "encodings"
    for enc, cache_name in _CACHE_NAMES.items():
        with resources.as_file(base / f"{enc}.tiktoken") as src:
            shutil.copyfile(src, os.path.join(out, cache_name))
    return out


class PeerWorker:
    """A peer's worker subprocess: send a task, get back seconds, tokens and a status."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.cache = _cache_dir()
        env = {**os.environ, "TIKTOKEN_CACHE_DIR": self.cache, "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.comparators", name],
            cwd=str(ROOT),
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )

    def run(self, task: PeerTask, timeout: float) -> dict[str, Any]:
        """One timed call; a hung or crashed worker gives a status, not an exception."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write(json.dumps(asdict(task)) + "\n")
            self.proc.stdin.flush()
        except OSError as exc:
            return {"status": f"worker failed: {exc}"}
        line = _read_line(self.proc, timeout)
        if line is None:
            self.close()
            return {"status": f"timeout (> {timeout:.0f} s)"}
        result: dict[str, Any] = json.loads(line)
        return result

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.cache, ignore_errors=True)


def _read_line(proc: subprocess.Popen[str], timeout: float) -> str | None:
    import selectors

    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    ready = sel.select(timeout)
    sel.close()
    if not ready:
        return None
    line = proc.stdout.readline()
    return line or None


# ---- inside the worker process -------------------------------------------------------


def _stub_gcs() -> None:
    """prompt-poet imports google.cloud.storage for its GCS template loader, which is never
    used here; with ``--no-deps`` installs it may be missing, so stand in an empty module."""
    import types

    try:
        importlib.import_module("google.cloud.storage")
    except ImportError:
        for name in ("google", "google.cloud", "google.cloud.storage"):
            sys.modules.setdefault(name, types.ModuleType(name))
        cloud = sys.modules["google.cloud"]
        storage = sys.modules["google.cloud.storage"]
        for attr in ("Client", "Blob", "Bucket"):
            setattr(storage, attr, object)
        cloud.storage = sys.modules["google.cloud.storage"]  # type: ignore[attr-defined]
        sys.modules["google"].cloud = cloud  # type: ignore[attr-defined]


def _prompt_poet() -> Callable[[PeerTask], tuple[int, str]]:
    _stub_gcs()
    prompt_cls = importlib.import_module("prompt_poet").Prompt

    template = (
        "- name: system\n  role: system\n  truncation_priority: 0\n  content: |\n"
        "    {{ escape_special_characters(system) }}\n"
        "{% for role, text in parts %}"
        "- name: part{{ loop.index }}\n  role: {{ role }}\n"
        "  truncation_priority: {{ parts|length - loop.index0 }}\n  content: |\n"
        "    {{ escape_special_characters(text) }}\n"
        "{% endfor %}"
        "- name: query\n  role: user\n  truncation_priority: 0\n  content: |\n"
        "    {{ escape_special_characters(query) }}\n"
    )

    def run(task: PeerTask) -> tuple[int, str]:
        prompt = prompt_cls(
            raw_template=template,
            template_data={"system": task.system, "parts": task.parts, "query": task.query},
        )
        prompt.tokenize()
        prompt.truncate(token_limit=task.limit, truncation_step=1)
        return len(prompt.tokens), "ok"

    return run


def _priomptipy() -> Callable[[PeerTask], tuple[int, str]]:
    lib = importlib.import_module("priomptipy")
    AssistantMessage, Scope, SystemMessage, UserMessage, render = (
        lib.AssistantMessage,
        lib.Scope,
        lib.SystemMessage,
        lib.UserMessage,
        lib.render,
    )

    def run(task: PeerTask) -> tuple[int, str]:
        n = len(task.parts)
        children: list[Any] = [SystemMessage(task.system)]
        for i, (role, text) in enumerate(task.parts):
            msg = AssistantMessage(text) if role == "assistant" else UserMessage(text)
            children.append(Scope([msg], absolute_priority=1000 + i - n))
        children.append(UserMessage(task.query))
        out = asyncio.run(render(children, {"token_limit": task.limit, "tokenizer": "o200k_base"}))
        tokens = int(out["token_count"])  # a dict, though typed as RenderOutput
        status = "ok" if tokens <= task.limit else "over limit (returned silently)"
        return tokens, status

    return run


def _langchain() -> Callable[[PeerTask], tuple[int, str]]:
    import tiktoken
    from langchain_core.messages import (
        AIMessage,
        BaseMessage,
        HumanMessage,
        SystemMessage,
        trim_messages,
    )

    enc = tiktoken.get_encoding("o200k_base")

    def counter(messages: list[BaseMessage]) -> int:
        return 3 + sum(3 + len(enc.encode_ordinary(str(m.content))) for m in messages)

    def run(task: PeerTask) -> tuple[int, str]:
        msgs: list[BaseMessage] = [SystemMessage(task.system)]
        for role, text in task.parts:
            msgs.append(AIMessage(text) if role == "assistant" else HumanMessage(text))
        msgs.append(HumanMessage(task.query))
        kept = trim_messages(
            msgs,
            max_tokens=task.limit,
            token_counter=counter,
            strategy="last",
            include_system=True,
            start_on="human",
        )
        status = "ok" if kept and kept[-1].content == task.query else "query dropped"
        return counter(kept), status

    return run


_FACTORIES: dict[str, Callable[[], Callable[[PeerTask], tuple[int, str]]]] = {
    "prompt-poet": _prompt_poet,
    "priomptipy": _priomptipy,
    "langchain-trim_messages": _langchain,
}


def _worker(name: str) -> int:
    out = sys.stdout
    sys.stdout = sys.stderr  # a peer that prints must not break the protocol
    fn = _FACTORIES[name]()
    for line in sys.stdin:
        data = json.loads(line)
        task = PeerTask(
            data["system"],
            tuple((r, t) for r, t in data["parts"]),
            data["query"],
            data["limit"],
        )
        start = time.perf_counter()
        try:
            tokens, status = fn(task)
        except Exception as exc:  # a peer's own error is a result, reported by name
            seconds = time.perf_counter() - start
            message = " ".join(str(exc).split())[:120]
            result: dict[str, Any] = {
                "seconds": seconds,
                "status": f"error: {type(exc).__name__}: {message}",
            }
        else:
            seconds = time.perf_counter() - start
            result = {"seconds": seconds, "tokens": tokens, "status": status}
        out.write(json.dumps(result) + "\n")
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(_worker(sys.argv[1]))
