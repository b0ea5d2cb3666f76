"""Recall rankers: Okapi BM25 over Snowball-stemmed words (PyStemmer), and SQLite FTS5.

Both are lexical, incremental and score by the set of items alone. Measured on the
``memory`` bench chat (300 messages): ``bm25s`` builds its index again on every change
(5-25 ms; a warm turn here is about 0.2 ms) and answers in 0.2-0.4 ms; FTS5 adds items
for about 4 us each and answers in 100-150 us; the in-memory posting lists of
``Bm25Retriever`` answer in 20-40 us with the same shares, so they are the default.
"""

from __future__ import annotations

import functools
import heapq
import math
import re
import sqlite3
import threading
from collections.abc import Callable, Sequence

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
    scores depend only on the set indexed, ties are left to the caller (by key). Scores are
    relevances as ``Bm25Retriever`` gives them: BM25 over the searched terms' idf."""

    def __init__(self) -> None:
        self._db = sqlite3.connect(":memory:", check_same_thread=False)
        self._db.execute(
            "CREATE VIRTUAL TABLE items USING fts5(key UNINDEXED, body, "
            "tokenize='porter unicode61 remove_diacritics 2')"
        )
        self._lock = threading.Lock()
        # How many items hold each word (as written, lowercased): picks the query's rarest.
        self._df: dict[str, int] = {}
        self._rows = 0

    def index(self, items: Sequence[RecallItem]) -> None:
        with self._lock:
            for item in items:
                for word in set(_WORD.findall(item.text.lower())):
                    self._df[word] = self._df.get(word, 0) + 1
            self._db.executemany(
                "INSERT INTO items (key, body) VALUES (?, ?)",
                [(item.key, item.text) for item in items],
            )
            self._rows += len(items)

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
            n = self._rows
        # FTS5's idf per term (k1 1.2: an average item holding a term once scores its idf).
        weight = sum(max(1e-6, math.log((n - df[t] + 0.5) / (df[t] + 0.5))) for t in terms)
        return [(str(key), -float(score) / weight) for key, score in rows]


_STEMMER_LOCK = threading.Lock()


@functools.lru_cache(maxsize=1)
def _stemmer() -> Callable[[list[str]], list[str]]:
    import Stemmer  # PyStemmer; imported when recall first builds an index

    stem: Callable[[list[str]], list[str]] = Stemmer.Stemmer("english").stemWords
    return stem


def _stem(words: list[str]) -> list[str]:
    with _STEMMER_LOCK:  # a Stemmer is not safe to share between threads
        return _stemmer()(words)


@functools.lru_cache(maxsize=65_536)
def _analysed(text: str) -> tuple[int, dict[str, int]]:
    """``text``'s length in words and its stemmed words' counts (a fact about the text,
    remembered for the process: a restored conversation indexes its history again)."""
    words = _stem(_WORD.findall(text.lower()))
    counts: dict[str, int] = {}
    for word in words:
        counts[word] = counts.get(word, 0) + 1
    return len(words), counts  # shared: never changed


class Bm25Retriever:
    """Okapi BM25 (k1 1.5, b 0.75, Lucene's idf) over Snowball-stemmed words, from posting
    lists kept in memory: adding an item costs a look-up of its words' counts, a query
    the postings of its ``MAX_TERMS`` rarest words. Scores depend only on the set indexed:
    each item's score adds the terms in one order, and the sums of lengths are integers.

    A score is a relevance: BM25 over the sum of the searched terms' idf, which is what an
    item of average length holding each of them once scores. So 0.5 says the item matches
    about half the query's weight, whatever the query (a short item, or one repeating a
    word, may pass 1)."""

    K1 = 1.5
    B = 0.75

    def __init__(self) -> None:
        self._docs: dict[str, dict[str, int]] = {}
        self._lengths: dict[str, int] = {}
        self._total = 0
        # Posting lists are made for a word when a query first asks for it (a scan of the
        # items' counts), then kept up to date: indexing a restored history costs a
        # look-up per item, not a write per word. Once the scans have read as many counts
        # as the items hold (``_words``), every list is made at once (``_whole``): an index
        # kept for many queries (a restored conversation asked again and again) scans no
        # more, and one asked a few times never pays for the whole.
        self._postings: dict[str, dict[str, int]] = {}
        self._words = self._scanned = 0
        self._whole = False
        # Each searched word's idf and its items' shares of their scores (BM25's
        # ``idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * length / average))``), made when
        # a search first needs them: the counts and the average change with every item
        # indexed, so indexing forgets them.
        self._shares: dict[str, tuple[float, dict[str, float], float]] = {}
        self._lock = threading.Lock()

    def fork(self) -> Bm25Retriever:
        """A retriever holding the same items, to be extended on its own (posting lists
        are made again as its queries ask: they are kept up to date in place)."""
        other = Bm25Retriever()
        with self._lock:
            other._docs, other._lengths = dict(self._docs), dict(self._lengths)
            other._total, other._words = self._total, self._words
        return other

    def index(self, items: Sequence[RecallItem]) -> None:
        with self._lock:
            postings, docs, lengths = self._postings, self._docs, self._lengths
            total = self._total
            self._shares = {}
            for item in items:
                length, counts = _analysed(item.text)
                key = item.key
                docs[key] = counts
                lengths[key] = length
                total += length
                self._words += len(counts)
                if self._whole:
                    for word, n in counts.items():
                        postings.setdefault(word, {})[key] = n
                elif postings:
                    for word in postings.keys() & counts.keys():
                        postings[word][key] = counts[word]
            self._total = total

    def _posting(self, term: str) -> dict[str, int]:
        postings = self._postings
        posting = postings.get(term)
        if posting is None and not self._whole:
            self._scanned += len(self._docs)
            if self._scanned < self._words:
                posting = {key: n for key, counts in self._docs.items() if (n := counts.get(term))}
                postings[term] = posting
                return posting
            self._whole = True
            for key, counts in self._docs.items():
                for word, n in counts.items():
                    postings.setdefault(word, {})[key] = n
            posting = postings.get(term)
        return {} if posting is None else posting

    def search(self, query: str, k: int) -> Sequence[tuple[str, float]]:
        if k <= 0:
            return []
        scores, weight = self.scores(query)
        best = heapq.nsmallest(k, [(-score, key) for key, score in scores.items()])
        return [(key, -score / weight) for score, key in best]

    def scores(self, query: str) -> tuple[dict[str, float], float]:
        """Every matching item's BM25 score (in no set order) and the searched terms' idf
        sum, which a score is divided by to give ``search``'s relevance: what ``search``
        ranks, for a caller that wants every match and no order."""
        terms, weight = self.terms(query)
        scores: dict[str, float] = dict(terms[0][0]) if terms else {}
        for shares, _ in terms[1:]:
            get = scores.get
            for key, share in shares.items():
                scores[key] = get(key, 0.0) + share
        return scores, weight

    def terms(self, query: str) -> tuple[list[tuple[dict[str, float], float]], float]:
        """The searched terms' shares of their items' scores, in the order ``scores`` adds
        them (an item's score is its shares added in this order), each with its largest
        share, and the terms' idf sum: for a caller that reads only some items' scores."""
        with self._lock:
            n = len(self._lengths)
            if not n:
                return [], 0.0
            found = set()
            for term in _stem(query_terms(query)):
                posting = self._posting(term)
                if posting:
                    found.add((len(posting), term))
            terms: list[tuple[dict[str, float], float]] = []
            weight = 0.0
            for df, term in sorted(found)[:MAX_TERMS]:
                idf, shares, top = self._shares.get(term) or self._share(term, df, n)
                weight += idf
                terms.append((shares, top))
        return terms, weight

    def _share(self, term: str, df: int, n: int) -> tuple[float, dict[str, float], float]:
        """``term``'s idf, each item's share of its score and the largest (the lock held)."""
        average = self._total / n
        lengths = self._lengths
        k1, b = self.K1, self.B
        grown = k1 + 1.0
        idf = math.log(1.0 + (n - df + 0.5) / (df + 0.5))
        shares = {
            key: idf * tf * grown / (tf + k1 * (1.0 - b + b * lengths[key] / average))
            for key, tf in self._postings[term].items()
        }
        made = self._shares[term] = (idf, shares, max(shares.values()))
        return made
