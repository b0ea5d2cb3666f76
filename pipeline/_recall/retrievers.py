"""Recall rankers: Okapi BM25 over Snowball-stemmed words (PyStemmer), and SQLite FTS5.

Both are lexical, incremental and score by the set of items alone. Measured on the
``memory`` bench chat (300 messages): ``bm25s`` builds its index again on every change
(5-25 ms; a warm turn here is about 0.2 ms) and answers in 0.2-0.4 ms; FTS5 adds items
for about 4 us each and answers in 100-150 us; the in-memory posting lists of
``Bm25Retriever`` answer in 20-40 us with the same shares, so they are the default.
"""

from __future__ import annotations

import heapq
import math
import re
import sqlite3
import threading
from collections.abc import Sequence

from lamina.pipeline._model.recall import RecallItem

__all__ = ["Bm25Retriever", "Fts5Retriever", "query_terms"]

_WORD = re.compile(r"\w+")
# Terms that carry no topic; FTS5 would score them near zero anyway, but every OR term
# costs a posting-list scan.
_STOP = frozenset(
    (
        "a", "about", "above", "after", "again", "all", "also", "am", "an", "and", "any", "are",
        "as", "at", "be", "been", "before", "being", "both", "but", "by", "can", "could", "did",
        "do", "does", "doing", "done", "for", "from", "had", "has", "have", "having", "he", "her",
        "here", "hers", "him", "his", "how", "i", "if", "in", "into", "is", "it", "its", "just",
        "me", "more", "most", "my", "no", "nor", "not", "now", "of", "on", "once", "only", "or",
        "other", "our", "out", "over", "own", "same", "she", "should", "so", "some", "such", "than",
        "that", "the", "their", "them", "then", "there", "these", "they", "this", "those",
        "through", "to", "too", "under", "until", "up", "very", "was", "we", "were", "what", "when",
        "where", "which", "while", "who", "whom", "why", "will", "with", "would", "you", "your",
        "yours"
    )
)  # fmt: skip
MAX_TERMS = 8
"""The query's rarest words searched (a long message would otherwise OR dozens of terms,
1.2 ms a query on the bench chat; BM25's weight sits in the rare ones anyway)."""


def query_terms(query: str) -> list[str]:
    """The query's distinct words (lowercased, first-seen order) that are not stop words."""
    seen: dict[str, None] = {}
    for word in _WORD.findall(query.lower()):
        if word not in _STOP and word not in seen:
            seen[word] = None
    return list(seen)


class Fts5Retriever:
    """BM25 over an in-memory FTS5 table (``porter unicode61``): items are added one by one,
    scores depend only on the set indexed, ties are left to the caller (by key)."""

    def __init__(self) -> None:
        self._db = sqlite3.connect(":memory:", check_same_thread=False)
        self._db.execute(
            "CREATE VIRTUAL TABLE items USING fts5(key UNINDEXED, body, "
            "tokenize='porter unicode61 remove_diacritics 2')"
        )
        self._lock = threading.Lock()
        # How many items hold each word (as written, lowercased): picks the query's rarest.
        self._df: dict[str, int] = {}

    def index(self, items: Sequence[RecallItem]) -> None:
        with self._lock:
            for item in items:
                for word in set(_WORD.findall(item.text.lower())):
                    self._df[word] = self._df.get(word, 0) + 1
            self._db.executemany(
                "INSERT INTO items (key, body) VALUES (?, ?)",
                [(item.key, item.text) for item in items],
            )

    def search(self, query: str, k: int) -> Sequence[tuple[str, float]]:
        df = self._df
        found = [(df[t], t) for t in query_terms(query) if t in df]
        terms = [t for _, t in sorted(found)[:MAX_TERMS]]
        if not terms or k <= 0:
            return []
        match = " OR ".join('"' + term.replace('"', '""') + '"' for term in terms)
        with self._lock:
            rows = self._db.execute(
                "SELECT key, bm25(items) FROM items WHERE items MATCH ? "
                "ORDER BY bm25(items), key LIMIT ?",
                (match, k),
            ).fetchall()
        return [(str(key), -float(score)) for key, score in rows]


class Bm25Retriever:
    """Okapi BM25 (k1 1.5, b 0.75, Lucene's idf) over Snowball-stemmed words, from posting
    lists kept in memory: adding an item costs its words, a query the postings of its
    ``MAX_TERMS`` rarest words. Scores depend only on the set indexed: each item's score
    adds the terms in one order, and the sums of lengths are integers."""

    K1 = 1.5
    B = 0.75

    def __init__(self) -> None:
        import Stemmer  # PyStemmer; imported when recall first builds an index

        self._stem = Stemmer.Stemmer("english").stemWords
        self._postings: dict[str, dict[str, int]] = {}
        self._lengths: dict[str, int] = {}
        self._total = 0
        self._lock = threading.Lock()

    def index(self, items: Sequence[RecallItem]) -> None:
        with self._lock:
            for item in items:
                words = self._stem(_WORD.findall(item.text.lower()))
                self._lengths[item.key] = len(words)
                self._total += len(words)
                counts: dict[str, int] = {}
                for word in words:
                    counts[word] = counts.get(word, 0) + 1
                for word, n in counts.items():
                    self._postings.setdefault(word, {})[item.key] = n

    def search(self, query: str, k: int) -> Sequence[tuple[str, float]]:
        with self._lock:
            n = len(self._lengths)
            if not n or k <= 0:
                return []
            postings = self._postings
            found = {
                (len(postings[t]), t) for t in self._stem(query_terms(query)) if t in postings
            }
            average = self._total / n
            lengths = self._lengths
            scores: dict[str, float] = {}
            for df, term in sorted(found)[:MAX_TERMS]:
                idf = math.log(1.0 + (n - df + 0.5) / (df + 0.5))
                for key, tf in postings[term].items():
                    norm = self.K1 * (1.0 - self.B + self.B * lengths[key] / average)
                    scores[key] = scores.get(key, 0.0) + idf * tf * (self.K1 + 1.0) / (tf + norm)
        best = heapq.nsmallest(k, [(-score, key) for key, score in scores.items()])
        return [(key, -score) for score, key in best]
