"""``lamina bench --suite server``: turns over HTTP (``lamina serve`` on loopback) against
the in-process build of the same turns, measured in the same run.

Points: 16 concurrent conversations x 20 turns (turns/s, p50/p99 latency of a turn
request), and 5 conversations one at a time (the per-turn overhead, paired turn by turn
with the in-process build, and with ``ConversationHub.turn`` in process: the same build,
save and trace turn the server answers; in wall time and, load-proof, in CPU time: the
server process's against the in-process hub's; p50 and p95). Client and server share this
machine's cores. Nothing here asserts a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import http.client
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import orjson
from rich.console import Console
from rich.table import Table

from benchmarks.workload import Workload, conversation_workload, write_vault

__all__ = ["main", "run_server_bench"]

SEED = 20260
SYSTEM = "You are the project assistant. Answer from the attached context and cite note paths."
ROOT = Path(__file__).resolve().parents[1]
TARGET_OVERHEAD_MS = 2.0
# What the HTTP turn is paired with: the same work in process, so the difference is HTTP.
BASELINE = (
    "ConversationHub.turn in process: build, save (SQLite), and the trace turn the server "
    "answers (the messages to send, layers, stats, cache report); the reply's second save "
    "is timed apart, on both sides"
)


def _quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _cpu_ns(pid: int) -> int | None:
    """CPU time (ns, user + system, every thread) the process ``pid`` used so far; None
    where /proc has no schedstat (not Linux)."""
    total = 0
    tasks = glob.glob(f"/proc/{pid}/task/*/schedstat")
    if not tasks:
        return None
    for path in tasks:
        with contextlib.suppress(OSError, ValueError, IndexError):
            total += int(Path(path).read_text().split()[0])
    return total


class _Lockstep:
    """One conversation three ways, turn by turn, so the machine's load hits all alike: the
    in-process build, the in-process build + save (what the server does), and HTTP.

    The HTTP client is the standard library's keep-alive ``http.client`` (httpx's own
    work was 1.3 ms CPU a turn against 0.5 ms: a client's cost, not the server's); it
    decodes the answer with ``orjson``, as the server encodes it (``json.loads`` takes
    about 0.25 ms more for a turn's ~240 KB answer). Beside
    wall time it records CPU: the server process's (every thread) per turn request, and
    the in-process build + save's, so the server's overhead is also measured in a unit
    the machine's load does not inflate."""

    def __init__(self, workload: Workload, vault: Path, store: Path, base: str, pid: int) -> None:
        from lamina import ConversationHub, ServerConfig

        self.workload = workload
        self.vault = vault
        self.hub = ConversationHub(ServerConfig(store=str(store), vault=vault))
        host, _, port = base.removeprefix("http://").rpartition(":")
        self.client = http.client.HTTPConnection(host, int(port), timeout=300)
        self.pid = pid
        self.times: dict[str, list[float]] = {
            "build": [], "save": [], "http": [], "save_cpu": [], "server_cpu": [],
            "reply": [], "http_reply": [],
        }  # fmt: skip

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        self.client.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        response = self.client.getresponse()
        raw = response.read()
        if response.status >= 400:
            raise RuntimeError(f"{path}: {response.status} {raw[:200]!r}")
        out: dict[str, Any] = orjson.loads(raw)
        return out

    def run(self, rounds: int = 1) -> dict[str, list[float]]:
        """The workload's conversation ``rounds`` times, a new conversation each time."""
        try:
            for _ in range(rounds):
                self._conversation()
        finally:
            self.hub.close()
            self.client.close()
        return self.times

    def _conversation(self) -> None:
        from lamina import Conversation
        from lamina._api_models import ConversationCreate, HeadIn, ReplyIn, TurnIn

        conv = Conversation(SYSTEM, vault=self.vault)
        cid, head = self.hub.create(ConversationCreate(system=SYSTEM))
        created = self._post("/v1/conversations", {"system": SYSTEM})
        remote, remote_head = created["id"], created["head"]
        for t in self.workload.turns:
            attach = [{"note": p} for p in t.attach]
            started = time.perf_counter()
            conv.turn(t.query, attach)
            self.times["build"].append(time.perf_counter() - started)
            conv.reply(t.reply)

            parent = HeadIn(turn=head.turn, hash=head.hash)
            body = TurnIn(parent=parent, user=t.query, attach=attach)
            started, cpu = time.perf_counter(), time.thread_time()
            _, head = self.hub.turn(cid, body)
            self.times["save"].append(time.perf_counter() - started)
            self.times["save_cpu"].append(time.thread_time() - cpu)
            reply = ReplyIn(parent=HeadIn(turn=head.turn, hash=head.hash), text=t.reply)
            started = time.perf_counter()
            head = self.hub.reply(cid, reply)
            self.times["reply"].append(time.perf_counter() - started)

            request = {"parent": remote_head, "user": t.query, "attach": attach}
            before = _cpu_ns(self.pid)
            started = time.perf_counter()
            response = self._post(f"/v1/conversations/{remote}/turns", request)
            self.times["http"].append(time.perf_counter() - started)
            after = _cpu_ns(self.pid)
            if before is not None and after is not None:
                self.times["server_cpu"].append((after - before) / 1e9)
            answer = {"parent": response["head"], "text": t.reply}
            started = time.perf_counter()
            remote_head = self._post(f"/v1/conversations/{remote}/reply", answer)["head"]
            self.times["http_reply"].append(time.perf_counter() - started)


async def _conversation(client: httpx.AsyncClient, workload: Workload) -> list[float]:
    """One conversation over HTTP: seconds per turn request (the reply is not timed)."""
    created = await client.post("/v1/conversations", json={"system": SYSTEM})
    cid = created.json()["id"]
    head = created.json()["head"]
    times = []
    for t in workload.turns:
        body = {"parent": head, "user": t.query, "attach": [{"note": p} for p in t.attach]}
        started = time.perf_counter()
        response = await client.post(f"/v1/conversations/{cid}/turns", json=body)
        times.append(time.perf_counter() - started)
        if response.status_code != 200:
            raise RuntimeError(f"turn failed: {response.status_code} {response.text}")
        reply = {"parent": response.json()["head"], "text": t.reply}
        head = (await client.post(f"/v1/conversations/{cid}/reply", json=reply)).json()["head"]
    return times


async def _http(
    base: str, workload: Workload, conversations: int
) -> tuple[list[list[float]], float]:
    limits = httpx.Limits(max_connections=conversations)
    async with httpx.AsyncClient(base_url=base, timeout=300, limits=limits) as client:
        started = time.perf_counter()
        runs = [_conversation(client, workload) for _ in range(conversations)]
        times = await asyncio.gather(*runs)
        return list(times), time.perf_counter() - started


def run_server_bench(conversations: int = 16, turns: int = 20, rounds: int = 5) -> dict[str, Any]:
    """Measure every point and return the JSON-ready result document; the lockstep runs
    ``rounds`` conversations of ``turns`` turns, one after the other."""
    workload = conversation_workload(SEED, turns)
    with tempfile.TemporaryDirectory(prefix="lamina-bench-server-") as tmp:
        vault = Path(tmp) / "vault"
        write_vault(workload, vault)
        port = _free_port()
        command = [sys.executable, "-m", "lamina._cli", "serve", "--port", str(port)]
        store = ["--store", str(Path(tmp) / "serve.sqlite"), "--vault", str(vault)]
        server = subprocess.Popen(
            [*command, *store], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        base = f"http://127.0.0.1:{port}"
        try:
            _wait(base, server)
            # A first pass warms the tokenizers and imports on both sides.
            _Lockstep(workload, vault, Path(tmp) / "warm.sqlite", base, server.pid).run()
            lockstep = _Lockstep(workload, vault, Path(tmp) / "hub.sqlite", base, server.pid)
            one = lockstep.run(rounds)
            concurrent, wall = asyncio.run(_http(base, workload, conversations))
        finally:
            server.terminate()
            server.wait(timeout=30)
    latencies = [x for conv in concurrent for x in conv]
    build, save, http_ = one["build"], one["save"], one["http"]
    paired = [h - b for h, b in zip(http_, build, strict=True)]
    over_save = [h - b for h, b in zip(http_, save, strict=True)]
    ratio = [h / b for h, b in zip(http_, save, strict=True)]
    reply_over = [h - b for h, b in zip(one["http_reply"], one["reply"], strict=True)]
    cpu_over = [s - b for s, b in zip(one["server_cpu"], one["save_cpu"], strict=False)]
    return {
        "suite": "server",
        "conversations": conversations,
        "turns": turns,
        "paired_turns": len(http_),
        "workload": workload.name,
        "baseline": BASELINE,
        "concurrent": {
            "turns_per_s": round(len(latencies) / wall, 2),
            "p50_ms": _ms(_quantile(latencies, 0.5)),
            "p99_ms": _ms(_quantile(latencies, 0.99)),
        },
        "sequential": {
            "http_p50_ms": _ms(statistics.median(http_)),
            "http_p95_ms": _ms(_quantile(http_, 0.95)),
            "build_p50_ms": _ms(statistics.median(build)),
            "build_and_save_p50_ms": _ms(statistics.median(save)),
            "build_and_save_p95_ms": _ms(_quantile(save, 0.95)),
            "overhead_p50_ms": _ms(statistics.median(paired)),
            "overhead_p99_ms": _ms(_quantile(paired, 0.99)),
            "http_over_build_and_save_p50_ms": _ms(statistics.median(over_save)),
            "http_over_build_and_save_p95_ms": _ms(_quantile(over_save, 0.95)),
            "http_to_build_and_save_ratio_p50": round(statistics.median(ratio), 3),
            "server_cpu_over_build_and_save_p50_ms": (
                _ms(statistics.median(cpu_over)) if cpu_over else None
            ),
            "server_cpu_over_build_and_save_p95_ms": (
                _ms(_quantile(cpu_over, 0.95)) if cpu_over else None
            ),
            "reply_in_process_p50_ms": _ms(statistics.median(one["reply"])),
            "http_reply_over_in_process_p50_ms": _ms(statistics.median(reply_over)),
            "http_reply_over_in_process_p95_ms": _ms(_quantile(reply_over, 0.95)),
        },
        "concurrent_overhead_per_turn_ms": _ms(wall / len(latencies) - sum(build) / len(build)),
        "target_overhead_p50_ms": TARGET_OVERHEAD_MS,
        "python": sys.version.split()[0],
    }


def _wait(base: str, server: subprocess.Popen[bytes]) -> None:
    for _ in range(600):
        if server.poll() is not None:
            raise RuntimeError("lamina serve exited")
        try:
            if httpx.get(f"{base}/v1/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.1)
    raise RuntimeError("lamina serve did not start")


def format_table(doc: dict[str, Any], console: Console) -> None:
    title = f"lamina serve: {doc['conversations']} conversations x {doc['turns']} turns"
    table = Table(title=title)
    table.add_column("measure")
    table.add_column("value", justify="right")
    c, s = doc["concurrent"], doc["sequential"]
    cpu = s["server_cpu_over_build_and_save_p50_ms"]
    cpu95 = s["server_cpu_over_build_and_save_p95_ms"]
    rows = [
        ("turns/s (concurrent, over HTTP)", f"{c['turns_per_s']:.1f}"),
        ("turn latency p50 / p99 (concurrent)", f"{c['p50_ms']:.1f} / {c['p99_ms']:.1f} ms"),
        ("in-process build p50", f"{s['build_p50_ms']:.2f} ms"),
        (
            "in-process hub: build + save + trace p50 / p95",
            f"{s['build_and_save_p50_ms']:.2f} / {s['build_and_save_p95_ms']:.2f} ms",
        ),
        ("HTTP turn p50 / p95", f"{s['http_p50_ms']:.2f} / {s['http_p95_ms']:.2f} ms"),
        (
            "overhead over the build p50 / p99",
            f"{s['overhead_p50_ms']:.2f} / {s['overhead_p99_ms']:.2f} ms",
        ),
        (
            "HTTP over the in-process hub p50 / p95",
            f"{s['http_over_build_and_save_p50_ms']:.2f} / "
            f"{s['http_over_build_and_save_p95_ms']:.2f} ms "
            f"(target <= {doc['target_overhead_p50_ms']:g} at p50)",
        ),
        ("HTTP / in-process hub p50", f"{s['http_to_build_and_save_ratio_p50']:.2f}x"),
        (
            "server CPU over the hub's CPU p50 / p95",
            "n/a" if cpu is None else f"{cpu:.2f} / {cpu95:.2f} ms",
        ),
        ("in-process reply (the turn saved again) p50", f"{s['reply_in_process_p50_ms']:.2f} ms"),
        (
            "reply over HTTP over in process p50 / p95",
            f"{s['http_reply_over_in_process_p50_ms']:.2f} / "
            f"{s['http_reply_over_in_process_p95_ms']:.2f} ms",
        ),
        ("overhead per turn under load", f"{doc['concurrent_overhead_per_turn_ms']:.2f} ms"),
    ]
    for row in rows:
        table.add_row(*row)
    console.print(table)
    console.print(f"{doc['paired_turns']} paired turns; baseline: {doc['baseline']}")


def main(out: str | None = None, conversations: int = 16, turns: int = 20) -> int:
    console = Console()
    doc = run_server_bench(conversations, turns)
    format_table(doc, console)
    if out is not None:
        from lamina._files import write_atomic  # whole or not at all

        write_atomic(out, json.dumps(doc, indent=2) + "\n")
        console.print(f"results written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else None))
