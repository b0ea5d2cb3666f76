"""Summaries of recoverable content: an offline extractive default, an LLM adapter, a memo.

Only recoverable items may be summarized (invariant 6); callers enforce that.
Every summarizer returns text within its token target, and reports what went wrong.
"""

from __future__ import annotations

import array
import asyncio
import inspect
import itertools
import math
import re
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Coroutine, Hashable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol, TypeAlias, TypeVar, runtime_checkable

import attrs

from lamina.pipeline._errors import ConfigError
from lamina.pipeline._hashing import text_hash
from lamina.pipeline._text.markdown import split_sections, trim_blank_lines
from lamina.pipeline._tokens.counter import TokenCounter
from lamina.pipeline._views.preview import (
    FRONTMATTER,
    OMITTED_LINE,
    cut_to_tokens,
    frontmatter_end,
)

__all__ = [
    "Complete",
    "LLMSummarizer",
    "PreparesSummaries",
    "Summarizer",
    "SummaryBacking",
    "SummaryCache",
    "SummaryKey",
    "SummaryPool",
    "SummaryResult",
    "TextRankSummarizer",
    "summary_pool",
]

Complete = Callable[[str], str | Awaitable[str]]
"""Any prompt -> completion callable, sync or async (e.g. a thin wrapper over an SDK call)."""

_T = TypeVar("_T")


@attrs.frozen
class SummaryResult:
    """A summary and what failed while making it (empty when everything worked)."""

    text: str
    failures: tuple[str, ...] = ()


@runtime_checkable
class Summarizer(Protocol):
    """Turns text into at most ``target_tokens`` tokens. ``id`` keys the summary memo, which
    conversations share (store, process pool): it names the summarizer and its settings."""

    @property
    def id(self) -> str: ...

    def summarize(self, text: str, target_tokens: int) -> SummaryResult: ...


@runtime_checkable
class PreparesSummaries(Protocol):
    """A summarizer that can do the target-free part of a summary ahead of time (TextRank's
    ranking), so that a later budget cut only selects sentences."""

    def prepare(self, text: str) -> None: ...


# --- TextRank -------------------------------------------------------------------------

_STOPWORDS = frozenset(
    re.findall(
        r"\w+",
        "a about after all also an and any are as at be been before being but by can could "
        "did do does each for from had has have he her his how i if in into is it its just "
        "may more most much must no not of on only or other our out over own same she should "
        "so some such than that the their them then there these they this those through to "
        "too under up very was we were what when where which while who why will with would "
        "you your",
    )
)
_WORD = re.compile(r"\w+", re.UNICODE)
_SENTENCE_END = re.compile(r"(?<=[.!?…])[\"'\u201d\u2019)\]]*\s+|(?<=[\u3002\uff01\uff1f])")
_LIST_ITEM = re.compile(r"^\s*(?:[-*+]|\d{1,9}[.)])\s+")
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_WS = re.compile(r"\s+")


@attrs.frozen
class _Sentence:
    index: int
    heading: int  # index into the heading list, -1 before the first heading
    paragraph: int
    text: str


def _paragraphs(body: str) -> list[str]:
    """Prose paragraphs of a section body: blank-line separated, list items apart, code skipped."""
    out: list[str] = []
    current: list[str] = []
    fence: str | None = None

    def flush() -> None:
        if current:
            out.append(" ".join(current))
            current.clear()

    for line in body.splitlines():
        m = _FENCE.match(line)
        if fence is not None:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence):
                fence = None
            continue
        if m:
            flush()
            fence = m.group(1)
            continue
        if not line.strip() or OMITTED_LINE.fullmatch(line.strip()):  # a count, not prose
            flush()
        elif _LIST_ITEM.match(line):
            flush()
            current.append(line.strip())
        else:
            current.append(line.strip())
    flush()
    return out


def _sentences(text: str) -> tuple[list[str], list[_Sentence]]:
    """Headings and sentences (with their heading and paragraph) in document order; a
    note's frontmatter (its properties) holds none."""
    headings: list[str] = []
    sentences: list[_Sentence] = []
    paragraph = 0
    for heading, body in split_sections(text[frontmatter_end(text) :]):
        if heading is not None:
            headings.append(heading)
        for para in _paragraphs(body):
            for raw in _SENTENCE_END.split(para):
                clean = _WS.sub(" ", raw).strip()
                if not clean:
                    continue
                sentences.append(_Sentence(len(sentences), len(headings) - 1, paragraph, clean))
            paragraph += 1
    return headings, sentences


_Edges: TypeAlias = "list[tuple[array.array[int], array.array[float]]]"


@attrs.frozen(eq=False)
class _Ranking:
    """A text's headings, sentences, scores and best-first order, packed: the pool keeps one
    per text, so the sentences share one string and their numbers sit in arrays (an object
    per sentence held about three times the sentence's own characters)."""

    headings: tuple[str, ...]
    text: str  # the sentences' texts one after another
    ends: array.array[int]  # where each sentence ends in ``text``
    heading: array.array[int]
    paragraph: array.array[int]
    scores: array.array[float]
    order: array.array[int]

    @classmethod
    def pack(cls, headings: list[str], sentences: list[_Sentence], scores: list[float]) -> _Ranking:
        order = sorted(range(len(sentences)), key=lambda i: (-round(scores[i], 12), i))
        return cls(
            tuple(headings),
            "".join(s.text for s in sentences),
            array.array("I", itertools.accumulate(len(s.text) for s in sentences)),
            array.array("i", (s.heading for s in sentences)),
            array.array("I", (s.paragraph for s in sentences)),
            array.array("d", scores),
            array.array("I", order),
        )

    def __len__(self) -> int:
        return len(self.ends)

    def sentence(self, i: int) -> _Sentence:
        start = self.ends[i - 1] if i else 0
        return _Sentence(i, self.heading[i], self.paragraph[i], self.text[start : self.ends[i]])


def _pagerank(edges: _Edges, *, damping: float, max_iter: int, tol: float) -> list[float]:
    """Weighted PageRank by power iteration with a fixed node order (bit-for-bit repeatable).

    ``edges[i]`` holds node i's neighbours in ascending order and the edge weights. Same
    definition and defaults as ``networkx.pagerank``; written out because networkx 3 needs
    scipy for it, and a fixed summation order keeps scores identical on every machine.
    """
    n = len(edges)
    if n == 0:
        return []
    out_sum = [sum(w) for _, w in edges]
    rank = [1.0 / n] * n
    for _ in range(max_iter):
        dangling = damping * sum(rank[i] for i in range(n) if out_sum[i] == 0.0) / n
        new = [(1.0 - damping) / n + dangling] * n
        for i in range(n):
            if out_sum[i] == 0.0:
                continue
            share = damping * rank[i] / out_sum[i]
            for j, w in zip(*edges[i], strict=True):
                new[j] += share * w
        err = sum(abs(new[i] - rank[i]) for i in range(n))
        rank = new
        if err < n * tol:
            break
    return rank


def _words(sentence: str) -> frozenset[str]:
    """The content words of a sentence (lower case, no stopwords, longer than one letter)."""
    return frozenset(
        w for w in _WORD.findall(sentence.lower()) if w not in _STOPWORDS and len(w) > 1
    )


def _similarities(block: list[_Sentence]) -> _Edges:
    """TextRank overlap of every pair sharing a word: shared words over log|a| + log|b|
    (Mihalcea & Tarau 2004), as each sentence's neighbours and weights in ascending order.

    Word sets are made per block and pairs are counted in one flat array, so memory stays
    with the block, not with all sentences of a long text.
    """
    n = len(block)
    words = [_words(s.text) for s in block]
    logs = [math.log(len(w) + 1) for w in words]
    holders: dict[str, list[int]] = {}
    for i, ws in enumerate(words):
        for w in ws:
            holders.setdefault(w, []).append(i)
    shared = array.array("I", [0]) * (n * n)  # no n*n bytes object made on the way
    for members in holders.values():
        for x, i in enumerate(members):
            for j in members[x + 1 :]:
                shared[i * n + j] += 1
                shared[j * n + i] += 1
    edges: _Edges = []
    for i in range(n):
        row = shared[i * n : (i + 1) * n]
        cols = array.array("I", [j for j, common in enumerate(row) if common])
        # Same operands in the same order for (i, j) and (j, i), lower index first.
        li = logs[i]
        vals = array.array(
            "d",
            [row[j] / (logs[j] + li) for j in cols if j < i]
            + [row[j] / (li + logs[j]) for j in cols if j > i],
        )
        edges.append((cols, vals))
    return edges


@attrs.frozen
class TextRankSummarizer:
    """Deterministic, offline extractive summary: TextRank sentences in document order.

    Sentences are graph nodes joined by word-overlap similarity; PageRank (damping 0.85)
    ranks them; the best are kept, in original order under their headings, while the
    exact token count stays within the target. Ties go to the earlier sentence. Long
    inputs are ranked in windows of ``window`` sentences so the cost stays linear.
    """

    counter: TokenCounter = attrs.field(factory=TokenCounter)
    window: int = 100
    damping: float = 0.85
    max_iter: int = 100
    tol: float = 1e-6

    @property
    def id(self) -> str:
        """Names the algorithm, the tokenizer and, when not the defaults, every setting."""
        base = f"textrank-v1:{self.counter.name}"
        settings = (self.window, self.damping, self.max_iter, self.tol)
        if settings == _TEXTRANK_DEFAULTS:
            return base  # the id stores have always held for the defaults
        return (
            f"{base}:window={self.window},damping={self.damping!r},"
            f"max_iter={self.max_iter},tol={self.tol!r}"
        )

    def prepare(self, text: str) -> None:
        """Rank ``text``'s sentences into the process's summary pool (when it has room), so
        that summarizing it later costs only the selection."""
        if len(text) <= summary_pool().max_chars:
            self._ranking(text)

    def _ranking(self, text: str) -> _Ranking:
        return summary_pool().ranking(
            ("textrank", text_hash(text), self.id), len(text), lambda: self._rank(text)
        )

    def _rank(self, text: str) -> _Ranking:
        """Headings, sentences, scores and the best-first order: the target-free part, made
        once per text (the pool keeps it, so another target only cuts again)."""
        headings, sentences = _sentences(text)
        return _Ranking.pack(headings, sentences, self._scores(sentences))

    def _scores(self, sentences: list[_Sentence]) -> list[float]:
        scores: list[float] = []
        for start in range(0, len(sentences), self.window):
            block = sentences[start : start + self.window]
            weights = _similarities(block)
            ranks = _pagerank(weights, damping=self.damping, max_iter=self.max_iter, tol=self.tol)
            # Scale by block size so windows of different sizes compare fairly. A sentence
            # sharing no word with any other keeps PageRank's uniform share (about 1/n,
            # more than weakly linked ones get), though it is central to nothing: zero it.
            scores.extend(r * len(block) if weights[i][0] else 0.0 for i, r in enumerate(ranks))
        return scores

    def summarize(self, text: str, target_tokens: int) -> SummaryResult:
        """At most ``target_tokens`` tokens of ``text``'s most central sentences."""
        if target_tokens <= 0:
            return SummaryResult("")
        if cut_to_tokens(text, self.counter, target_tokens) == text:
            return SummaryResult(text)
        ranking = self._ranking(text)
        headings, scores = ranking.headings, ranking.scores
        if not len(ranking):
            return SummaryResult(self._cut(text, target_tokens))
        chosen: set[int] = set()
        used_headings: set[int] = set()
        spent = 0
        for i in ranking.order:
            s = ranking.sentence(i)
            if target_tokens - spent < 2:
                break
            cost = self.counter.count_once(s.text) + 1
            if s.heading >= 0 and s.heading not in used_headings:
                cost += self.counter.count(headings[s.heading]) + 2
            if spent + cost > target_tokens:
                continue
            chosen.add(i)
            spent += cost
            if s.heading >= 0:
                used_headings.add(s.heading)
        while chosen:
            out = _render(headings, [ranking.sentence(i) for i in sorted(chosen)])
            if self.counter.count(out) <= target_tokens:
                return SummaryResult(out)
            chosen.discard(max(chosen, key=lambda i: (round(scores[i], 12) * -1, i)))
        return SummaryResult(self._cut(text, target_tokens))

    def _cut(self, text: str, target_tokens: int) -> str:
        """``text`` cut at a word within ``target_tokens``, when no sentence fits: the text
        after its frontmatter, or properties alone cut at a line and closed again (a
        summary never leaves frontmatter open)."""
        end = frontmatter_end(text)
        prose = text[end:].strip()
        if not end or prose:
            return cut_to_tokens(prose or text, self.counter, target_tokens, boundary="word")
        closing = "\n" + FRONTMATTER
        room = target_tokens - self.counter.count(closing)
        head = cut_to_tokens(text[: end - len(closing)], self.counter, room, boundary="line")
        out = head + closing
        return out if self.counter.count(out) <= target_tokens else ""


_TEXTRANK_DEFAULTS = tuple(f.default for f in attrs.fields(TextRankSummarizer)[1:])


def _render(headings: Sequence[str], chosen: list[_Sentence]) -> str:
    """Chosen sentences in order: one line per paragraph, headings before their first sentence."""
    blocks: list[str] = []
    line: list[str] = []
    heading = -1
    paragraph = -1
    for s in chosen:
        if s.heading != heading or s.paragraph != paragraph:
            if line:
                blocks.append(" ".join(line))
                line = []
            if s.heading != heading and s.heading >= 0:
                blocks.append(headings[s.heading])
            heading, paragraph = s.heading, s.paragraph
        line.append(s.text)
    if line:
        blocks.append(" ".join(line))
    return "\n\n".join(blocks)


# --- LLM map-reduce -------------------------------------------------------------------

_CHUNK_PROMPT = (
    "Summarize the following text in at most {target} tokens. Keep headings, names, "
    "numbers, identifiers and decisions; do not add anything that is not in the text. "
    "Reply with the summary only.\n\n<text>\n{text}\n</text>"
)
_REDUCE_PROMPT = (
    "The following are summaries of consecutive parts of one document. Combine them into "
    "one summary of at most {target} tokens, in document order, without adding anything. "
    "Reply with the summary only.\n\n<summaries>\n{text}\n</summaries>"
)


def _run_sync(coro: Coroutine[Any, Any, _T]) -> _T:
    """Run ``coro`` to completion from sync code, even when an event loop is running here."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="lamina-summary") as pool:
        return pool.submit(asyncio.run, coro).result()


@attrs.frozen
class LLMSummarizer:
    """Map-reduce summaries through any ``complete(prompt) -> str`` callable, sync or async.

    The text is chunked by tokens at paragraph/sentence ends; chunks are summarized with at
    most ``concurrency`` calls in flight, each limited to ``timeout`` seconds. A chunk whose
    call fails, times out or returns nothing keeps its original text (cut to its share of
    the target) and is reported. Partial summaries are combined by a reduce call; whatever
    still exceeds the target is cut at a sentence end, and that is reported too. A sync
    ``complete`` that times out keeps running in its worker thread until it returns.
    Summaries are shared by ``id`` across conversations: name the model and prompt in it.
    """

    complete: Complete
    counter: TokenCounter = attrs.field(factory=TokenCounter)
    chunk_tokens: int = attrs.field(default=4000, kw_only=True)
    concurrency: int = attrs.field(default=4, kw_only=True)
    timeout: float | None = attrs.field(default=120.0, kw_only=True)
    id: str = attrs.field(default="llm", kw_only=True)
    max_rounds: int = attrs.field(default=3, kw_only=True)

    def __attrs_post_init__(self) -> None:
        if self.chunk_tokens < 64:
            raise ConfigError("chunk_tokens", f"must be >= 64, got {self.chunk_tokens}")
        if self.concurrency < 1:
            raise ConfigError("concurrency", f"must be >= 1, got {self.concurrency}")
        if self.timeout is not None and self.timeout <= 0:
            raise ConfigError("timeout", f"must be > 0 seconds or None, got {self.timeout}")

    def summarize(self, text: str, target_tokens: int) -> SummaryResult:
        """At most ``target_tokens`` tokens summarizing ``text``; failures listed, never raised."""
        return _run_sync(self.asummarize(text, target_tokens))

    async def asummarize(self, text: str, target_tokens: int) -> SummaryResult:
        """The same as ``summarize``, for hosts that already run an event loop."""
        if target_tokens <= 0:
            return SummaryResult("")
        if cut_to_tokens(text, self.counter, target_tokens) == text:
            return SummaryResult(text)
        failures: list[str] = []
        pool = ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="lamina-llm")
        try:
            current = text
            for round_no in range(1, self.max_rounds + 1):
                chunks = self._chunks(current)
                if len(chunks) == 1:
                    prompt = _REDUCE_PROMPT if round_no > 1 else _CHUNK_PROMPT
                    out, err = await self._call(
                        pool, prompt.format(target=target_tokens, text=current)
                    )
                    if err is None:
                        current = out
                    else:
                        failures.append(f"round {round_no}: {err}; kept the text as it was")
                    break
                current = await self._map(pool, chunks, target_tokens, round_no, failures)
                if self.counter.count(current) <= target_tokens:
                    break
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
        used = self.counter.count(current)
        if used > target_tokens:
            current = cut_to_tokens(current, self.counter, target_tokens, boundary="sentence")
            failures.append(f"result had {used} tokens > target {target_tokens}; cut to fit")
        return SummaryResult(current, tuple(failures))

    def _chunks(self, text: str) -> list[str]:
        """``text`` split into pieces of at most ``chunk_tokens`` at paragraph/sentence ends."""
        chunks: list[str] = []
        rest = trim_blank_lines(text)
        while rest:
            piece = cut_to_tokens(rest, self.counter, self.chunk_tokens, boundary="paragraph")
            if not piece:  # a single character over the limit cannot happen at >= 64 tokens
                piece = rest[:1]
            chunks.append(piece)
            rest = trim_blank_lines(rest[len(piece) :])
        return chunks

    async def _map(
        self,
        pool: ThreadPoolExecutor,
        chunks: list[str],
        target: int,
        round_no: int,
        failures: list[str],
    ) -> str:
        sizes = [self.counter.count(c) for c in chunks]
        total = sum(sizes)
        shares = [max(16, target * size // total) for size in sizes]
        sem = asyncio.Semaphore(self.concurrency)

        async def one(chunk: str, share: int) -> tuple[str, str | None]:
            async with sem:
                return await self._call(pool, _CHUNK_PROMPT.format(target=share, text=chunk))

        results = await asyncio.gather(*(one(c, s) for c, s in zip(chunks, shares, strict=True)))
        parts: list[str] = []
        for i, ((out, err), chunk, share) in enumerate(zip(results, chunks, shares, strict=True)):
            if err is None:
                parts.append(out)
            else:
                failures.append(
                    f"round {round_no} chunk {i + 1}/{len(chunks)}: {err}; kept its original text"
                )
                parts.append(cut_to_tokens(chunk, self.counter, share, boundary="sentence"))
        return "\n\n".join(parts)

    async def _call(self, pool: ThreadPoolExecutor, prompt: str) -> tuple[str, str | None]:
        """(completion, None) or ("", reason); never raises for a failing ``complete``."""
        try:
            if inspect.iscoroutinefunction(self.complete):
                pending: Awaitable[Any] = self.complete(prompt)
            else:
                loop = asyncio.get_running_loop()
                pending = loop.run_in_executor(pool, self.complete, prompt)
            result = await asyncio.wait_for(_settle(pending), self.timeout)
        except TimeoutError:
            return "", f"timed out after {self.timeout} s"
        except Exception as exc:
            return "", f"{type(exc).__name__}: {exc}"
        if not isinstance(result, str):
            return "", f"returned {type(result).__name__}, not str"
        if not result.strip():
            return "", "returned an empty summary"
        return result.strip(), None


async def _settle(pending: Awaitable[Any]) -> Any:
    """Await ``pending``, and its result too when a sync callable returned an awaitable."""
    result = await pending
    if inspect.isawaitable(result):
        result = await result
    return result


# --- memo -----------------------------------------------------------------------------


SummaryKey = tuple[str, int, str]
"""A memoized summary's key: (content hash, target tokens, summarizer id)."""


class SummaryBacking(Protocol):
    """Where memoized summaries outlive the process (a ``Store`` is one): get/put by key."""

    def get_summary(
        self, content_hash: str, target_tokens: int, summarizer_id: str
    ) -> SummaryResult | None: ...

    def put_summary(
        self, content_hash: str, target_tokens: int, summarizer_id: str, result: SummaryResult
    ) -> None: ...


DEFAULT_POOL_CHARS = 16_000_000


class SummaryPool:
    """Summaries and TextRank rankings shared by every conversation of the process.

    Summaries are keyed like ``SummaryCache`` (content hash, target, summarizer id: the id
    names the summarizer and its settings); rankings by text hash and summarizer id. Least
    recently used entries go once the texts held pass ``max_chars`` characters; 0 turns
    pooling off. Summaries with failures are not pooled (another conversation retries).
    Safe to share between threads.
    """

    __slots__ = ("_chars", "_entries", "_lock", "_max_chars", "hits", "misses")

    def __init__(self, max_chars: int = DEFAULT_POOL_CHARS) -> None:
        self._lock = threading.Lock()
        self._entries: OrderedDict[Hashable, tuple[object, int]] = OrderedDict()
        self._chars = 0
        self._max_chars = _pool_size(max_chars)
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def max_chars(self) -> int:
        return self._max_chars

    @property
    def chars(self) -> int:
        """Characters of text held now (summaries, failures, and ranked texts)."""
        return self._chars

    def resize(self, max_chars: int) -> None:
        """Hold at most ``max_chars`` characters from now on (0: keep nothing, pool off)."""
        with self._lock:
            self._max_chars = _pool_size(max_chars)
            self._evict()

    def clear(self) -> None:
        """Forget every pooled summary and ranking, and the hit counts (e.g. between tests)."""
        with self._lock:
            self._entries.clear()
            self._chars = 0
            self.hits = self.misses = 0

    def get_summary(self, key: SummaryKey) -> SummaryResult | None:
        """The pooled summary under ``key``, or None."""
        found = self._get(("summary", *key))
        return found if isinstance(found, SummaryResult) else None

    def put_summary(self, key: SummaryKey, result: SummaryResult) -> None:
        """Pool ``result`` under ``key`` (first write wins; one with failures is not kept)."""
        if not result.failures:
            self._put(("summary", *key), result, len(result.text))

    def ranking(self, key: Hashable, size: int, make: Callable[[], _Ranking]) -> _Ranking:
        """The ranking pooled under ``key``, made (outside the lock) and pooled on a miss."""
        found = self._get(("ranking", key))
        if found is not None:
            return found  # type: ignore[return-value]
        made = make()
        self._put(("ranking", key), made, size)
        return made

    def _get(self, key: Hashable) -> object | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return entry[0]

    def _put(self, key: Hashable, value: object, size: int) -> None:
        with self._lock:
            if key in self._entries or size > self._max_chars:
                return
            self._entries[key] = (value, size)
            self._chars += size
            self._evict()

    def _evict(self) -> None:
        while self._chars > self._max_chars:
            _, (_, size) = self._entries.popitem(last=False)
            self._chars -= size


def _pool_size(max_chars: int) -> int:
    if max_chars < 0:
        raise ConfigError("max_chars", f"must be >= 0 characters, got {max_chars}")
    return max_chars


_POOL = SummaryPool()


def summary_pool() -> SummaryPool:
    """The process's summary pool, which every ``SummaryCache`` reads and writes by default."""
    return _POOL


@attrs.define
class SummaryCache:
    """Summaries memoized by (content hash, target, summarizer id), so a compacted artifact
    renders to the same bytes every turn and the cached prefix survives.

    A miss reads the ``backing`` (the conversation's store), then the ``pool`` shared by the
    process's conversations, before summarizing. Summaries made here or found in the pool
    stay ``unsaved()`` until a store writes them with a turn (``mark_saved``) or ``flush()``,
    so a restored conversation renders the same bytes without the pool.
    """

    _entries: dict[SummaryKey, SummaryResult] = attrs.field(factory=dict, repr=False)
    hits: int = 0
    misses: int = 0
    backing: SummaryBacking | None = attrs.field(default=None, kw_only=True, repr=False)
    pool: SummaryPool | None = attrs.field(factory=summary_pool, kw_only=True, repr=False)
    _unsaved: dict[SummaryKey, None] = attrs.field(factory=dict, repr=False, kw_only=True)

    def __len__(self) -> int:
        return len(self._entries)

    def get(
        self, content_hash: str, target_tokens: int, summarizer_id: str
    ) -> SummaryResult | None:
        """The stored summary (here, else in the backing, else in the pool), or None."""
        key = (content_hash, target_tokens, summarizer_id)
        found = self._entries.get(key)
        if found is not None:
            return found
        if self.backing is not None:
            found = self.backing.get_summary(*key)
            if found is not None:
                self._entries[key] = found
                if self.pool is not None:
                    self.pool.put_summary(key, found)
                return found
        if self.pool is not None:
            found = self.pool.get_summary(key)
            if found is not None:
                self._entries[key] = found
                self._unsaved[key] = None  # the backing lacks it: save it with the turn
        return found

    def put(
        self, content_hash: str, target_tokens: int, summarizer_id: str, result: SummaryResult
    ) -> None:
        """Store ``result`` (first write wins: a stored summary never changes under a key)."""
        key = (content_hash, target_tokens, summarizer_id)
        if key not in self._entries:
            self._entries[key] = result
            self._unsaved[key] = None
            if self.pool is not None:
                self.pool.put_summary(key, result)

    def made(
        self, summarizer: Summarizer, content_hash: str, target_tokens: int
    ) -> SummaryResult | None:
        """The summary ``summarizer`` made of ``content_hash`` for this conversation (here or
        in its backing), or None; nothing is summarized. The process's pool is not read:
        what other conversations summarized must not change this one's decisions."""
        key = (content_hash, target_tokens, _memo_id(summarizer))
        found = self._entries.get(key)
        if found is None and self.backing is not None:
            found = self.backing.get_summary(*key)
            if found is not None:
                self._entries[key] = found
        return found

    def summarize(
        self, summarizer: Summarizer, content_hash: str, text: str, target_tokens: int
    ) -> SummaryResult:
        """The memoized summary of ``text``, made by ``summarizer`` on a miss."""
        summarizer_id = _memo_id(summarizer)
        found = self.get(content_hash, target_tokens, summarizer_id)
        if found is not None:
            self.hits += 1
            return found
        self.misses += 1
        result = summarizer.summarize(text, target_tokens)
        self.put(content_hash, target_tokens, summarizer_id, result)
        return result

    def unsaved(self) -> tuple[tuple[SummaryKey, SummaryResult], ...]:
        """Summaries made here and not yet written to a backing, oldest first."""
        return tuple((key, self._entries[key]) for key in self._unsaved)

    def mark_saved(self, keys: Iterable[SummaryKey]) -> None:
        """Forget that ``keys`` are unsaved (a store wrote them, e.g. with a turn)."""
        for key in keys:
            self._unsaved.pop(key, None)

    def flush(self) -> None:
        """Write every unsaved summary to the backing (one call each); no-op without one."""
        if self.backing is None:
            return
        for key, result in self.unsaved():
            self.backing.put_summary(*key, result)
            self._unsaved.pop(key, None)


def _memo_id(summarizer: Summarizer) -> str:
    """The id ``summarizer``'s summaries are memoized under: its ``id``, and for an
    ``LLMSummarizer`` also the settings that change its output when not the defaults."""
    if not isinstance(summarizer, LLMSummarizer):
        return summarizer.id
    settings = (summarizer.counter.name, summarizer.chunk_tokens, summarizer.max_rounds)
    if settings == _LLM_DEFAULTS:
        return summarizer.id  # the id stores have always held for the defaults
    name, chunk, rounds = settings
    return f"{summarizer.id}:{name}:chunk_tokens={chunk},max_rounds={rounds}"


_LLM_DEFAULTS = (
    TokenCounter().name,
    attrs.fields(LLMSummarizer).chunk_tokens.default,
    attrs.fields(LLMSummarizer).max_rounds.default,
)
