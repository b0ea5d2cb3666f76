"""Offline, exact token counts with the shipped encodings."""

from __future__ import annotations

import random
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lamina.pipeline.errors import ConfigError
from lamina.pipeline.tokens import CountMemo, TokenCounter, get_encoding
from tests.forked import in_forked_child


def test_encodings_load_from_package_data_without_network() -> None:
    code = (
        "import socket\n"
        "def no(*a, **k): raise SystemExit('network used')\n"
        "socket.socket.connect = no; socket.create_connection = no\n"
        "from lamina.pipeline.tokens import TokenCounter\n"
        "o, c = TokenCounter('o200k_base'), TokenCounter('cl100k_base')\n"
        "print(o.count('hello world'), c.count('hello world'))\n"
    )
    env = {"PATH": "/usr/bin:/bin", "TIKTOKEN_CACHE_DIR": "/nonexistent"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    assert out.stdout.split() == ["2", "2"]


def test_counts_match_tiktoken_reference_values() -> None:
    assert TokenCounter().count("Lamina builds prompts.") == len(
        get_encoding("o200k_base").encode_ordinary("Lamina builds prompts.")
    )
    assert TokenCounter().count("") == 0


def test_special_token_text_counts_as_plain_text() -> None:
    assert TokenCounter().count("<|endoftext|>") > 1


def test_unknown_tokenizer_names_the_choices() -> None:
    with pytest.raises(ConfigError, match="unknown tokenizer 'gpt2'.*cl100k_base, o200k_base"):
        TokenCounter("gpt2")


def test_counts_are_cached_by_content() -> None:
    counter = TokenCounter()
    counter.count("some text")
    counter.count("some text")
    assert counter.hits == 1
    assert counter.encoded_chars == len("some text")


_piece = st.text(alphabet=st.sampled_from(list("ab <>/\n\t.,!?'\"#-é漢😀0123\r")), max_size=12)


@settings(max_examples=300, deadline=None)
@given(
    parts=st.lists(_piece, min_size=1, max_size=6),
    name=st.sampled_from(["o200k_base", "cl100k_base"]),
)
def test_count_joined_equals_counting_the_joined_text(parts: list[str], name: str) -> None:
    counter = TokenCounter(name)
    joined = "\n\n".join(p for p in parts if p)
    assert counter.count_joined(parts) == len(get_encoding(name).encode_ordinary(joined))


_xmlish = st.text(
    alphabet=st.sampled_from(list("ab Z9<>/=\"'.,!?#-_:;()[]{}\n\té漢😀\u0301")),
    min_size=1,
    max_size=30,
)


@settings(max_examples=600, deadline=None)
@given(text=_xmlish, name=st.sampled_from(["o200k_base", "cl100k_base"]))
def test_count_with_sep_equals_encoding_text_and_separator(text: str, name: str) -> None:
    counter = TokenCounter(name)
    assert counter.count_with_sep(text) == len(get_encoding(name).encode_ordinary(text + "\n\n"))
    assert counter.count_with_sep(text + ">") == len(
        get_encoding(name).encode_ordinary(text + ">\n\n")
    )


def test_text_hash_of_a_long_text_equals_hashing_its_bytes() -> None:
    import xxhash

    from lamina.pipeline.text import text_hash

    text = ("é漢😀 plain ascii " * 200_000)[:3_000_001]
    assert text_hash(text) == xxhash.xxh3_128_hexdigest(text.encode("utf-8"))


def test_count_many_on_threads_gives_the_serial_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    """A large batch is encoded on threads; counts, cache and meters match one-by-one."""
    import lamina.pipeline._tokens.counter as tokens_module

    rng = random.Random(5)
    texts = ["".join(rng.choice("ab .\n#é") for _ in range(rng.randint(0, 400))) for _ in range(60)]
    texts += texts[:5]  # repeats are counted once and reported as hits
    serial = TokenCounter()
    expected = [serial.count(t) for t in texts]
    monkeypatch.setattr(tokens_module, "PARALLEL_CHARS", 1)
    monkeypatch.setattr(tokens_module, "_workers", lambda: 2)
    threaded = TokenCounter(memo=CountMemo())  # its own memo: meters comparable
    assert threaded.count_many(texts) == expected
    assert threaded.encoded_chars == serial.encoded_chars
    assert threaded.count_many(texts) == expected  # now every count is a hit
    assert threaded.encoded_chars == serial.encoded_chars
    assert [serial.count(t) for t in texts] == expected
    assert threaded.hits == serial.hits


def test_the_count_memo_forgets_its_oldest_quarter(monkeypatch: pytest.MonkeyPatch) -> None:
    import lamina.pipeline._tokens.counter as tokens_module

    monkeypatch.setattr(tokens_module, "MAX_REMEMBERED", 8)
    counter = TokenCounter()
    for i in range(20):
        counter.count(f"text number {i}")
    assert len(counter.memo or ()) <= 8
    before = counter.encoded_chars
    counter.count("text number 19")  # the newest is remembered
    assert counter.encoded_chars == before
    counter.count("text number 0")  # the oldest was forgotten and is encoded again
    assert counter.encoded_chars == before + len("text number 0")


@settings(max_examples=300, deadline=None)
@given(
    head=_xmlish,
    rest=st.lists(_xmlish, min_size=1, max_size=8).map("".join),
    name=st.sampled_from(["o200k_base", "cl100k_base"]),
)
def test_long_text_counted_as_first_line_and_rest_is_exact(head: str, rest: str, name: str) -> None:
    """``count`` splits a long text after its first line; the sum is the true count."""
    text = head + "\n" + (rest * (4200 // len(rest) + 1))
    counter = TokenCounter(name)
    assert counter.count(text) == len(get_encoding(name).encode_ordinary(text))
    assert counter.count_many([text, text[1:]]) == [
        len(get_encoding(name).encode_ordinary(t)) for t in (text, text[1:])
    ]


def test_a_block_rendered_again_with_other_attributes_encodes_only_its_tag_line() -> None:
    counter = TokenCounter()
    body = "Paragraph of the note. " * 400 + "\n</note>"
    counter.count('<note key="a">\n' + body)
    before = counter.encoded_chars
    assert counter.count('<note key="a" form="full" newer="true">\n' + body) > 0
    assert counter.encoded_chars - before == len('<note key="a" form="full" newer="true">\n')


def test_count_many_keeps_its_answers_when_remembering_forgets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A full memo forgets while a threaded batch is remembered; answers stay exact."""
    import lamina.pipeline._tokens.counter as tokens_module

    monkeypatch.setattr(tokens_module, "MAX_REMEMBERED", 8)
    monkeypatch.setattr(tokens_module, "PARALLEL_CHARS", 1)
    monkeypatch.setattr(tokens_module, "_workers", lambda: 2)
    counter = TokenCounter()
    old = [f"old text {i}" for i in range(7)]
    for text in old:
        counter.count(text)
    texts = old + [f"new text number {i}" for i in range(12)]
    enc = get_encoding("o200k_base")
    assert counter.count_many(texts) == [len(enc.encode_ordinary(t)) for t in texts]


@settings(max_examples=200, deadline=None)
@given(
    lines=st.lists(_xmlish, min_size=1, max_size=40),
    chunk=st.integers(min_value=1, max_value=64),
    name=st.sampled_from(["o200k_base", "cl100k_base"]),
)
def test_a_long_text_counted_in_chunks_is_counted_exactly(
    lines: list[str], chunk: int, name: str
) -> None:
    """Counting encodes at most about ``ENCODE_CHUNK`` characters at once (the token list is
    nine bytes a character), cutting where a new piece starts: the sum is the true count."""
    import lamina.pipeline._tokens.counter as tokens_module
    from lamina.pipeline.tokens import encoded_length

    text = "\n".join(lines)
    enc = get_encoding(name)
    original = tokens_module.ENCODE_CHUNK
    tokens_module.ENCODE_CHUNK = chunk
    try:
        assert encoded_length(enc, text, 0, len(text)) == len(enc.encode_ordinary(text))
        middle = len(text) // 3
        assert encoded_length(enc, text, middle, len(text)) == len(
            enc.encode_ordinary(text[middle:])
        )
        assert TokenCounter(name).count_once(text) == len(enc.encode_ordinary(text))
    finally:
        tokens_module.ENCODE_CHUNK = original


def test_counting_a_megabyte_holds_no_megabyte_token_list() -> None:
    """The peak while counting a 1 MB note stays near the text itself, not the ~9 MB list
    of token ids one encode of it would build."""
    import tracemalloc

    text = "\n".join(f"Line {i} of a long note, with words." for i in range(28_000))
    counter = TokenCounter()
    counter.count("warm up")
    tracemalloc.start()
    n = counter.count_many([text])[0]
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert n == len(get_encoding("o200k_base").encode_ordinary(text))
    assert peak < len(text) // 2


def test_one_counter_used_from_two_threads_stays_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    """A background promotion and the host may count on one counter at once; with a small
    memo forgetting all the time, every answer is still the true count."""
    import threading

    import lamina.pipeline._tokens.counter as tokens_module

    monkeypatch.setattr(tokens_module, "MAX_REMEMBERED", 16)
    counter = TokenCounter()
    enc = get_encoding("o200k_base")
    texts = [f"text {i} " * (i % 7 + 1) for i in range(300)]
    expected = [len(enc.encode_ordinary(t)) for t in texts]
    wrong: list[int] = []

    def work(offset: int) -> None:
        for i in range(len(texts)):
            j = (i + offset) % len(texts)
            if counter.count(texts[j]) != expected[j]:
                wrong.append(j)
            if counter.count_many(texts[j : j + 3]) != expected[j : j + 3]:
                wrong.append(j)

    threads = [threading.Thread(target=work, args=(k * 37,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == []
    assert len(counter.memo or ()) <= 16


def test_counters_share_the_process_memo_unless_given_their_own() -> None:
    """A count is a fact about the text: a second conversation's counter (a stateless
    server's next request) finds it; a counter with its own memo encodes again."""
    text = "A paragraph every request of a conversation sends again. " * 40
    first, second = TokenCounter(), TokenCounter()
    n = first.count(text)
    assert second.count(text) == n and second.encoded_chars == 0 and second.hits == 1
    own = TokenCounter(memo=CountMemo())
    assert own.count(text) == n and own.encoded_chars == len(text)
    assert TokenCounter("cl100k_base").memo is not first.memo  # one memo per encoding


_CUT_TEXT = st.lists(
    st.sampled_from(["word", " ", "\n", "\n\n", ".", "#", "## H 1", "x/y", "\t", "é", "1.", "  "]),
    max_size=40,
).map("".join)


@settings(max_examples=300, deadline=None)
@given(
    text=_CUT_TEXT,
    cuts=st.lists(st.integers(min_value=-2, max_value=200), max_size=8),
    name=st.sampled_from(["o200k_base", "cl100k_base"]),
)
def test_a_text_counted_in_parts_between_cuts_counts_as_encoded_whole(
    text: str, cuts: list[int], name: str
) -> None:
    """Cuts that do not follow a newline or start a piece are ignored, so any cuts give
    the exact count."""
    counter = TokenCounter(name, memo=CountMemo())
    assert counter.count_cut(text, cuts) == len(get_encoding(name).encode_ordinary(text))


def test_the_parts_between_cuts_are_remembered() -> None:
    counter = TokenCounter(memo=CountMemo())
    text = "<note>\n# Title\n\nIntro text.\n\n## Part 2\n\nBody text.\n</note>"
    cuts = [text.index("# Title"), text.index("## Part"), text.index("</note>")]
    counter.count_cut(text, cuts)
    before = counter.encoded_chars
    part = "## Part 2\n\nBody text.\n"
    assert counter.count(part) == len(counter.encoding.encode_ordinary(part))
    assert counter.encoded_chars == before


def test_known_reads_a_count_without_encoding() -> None:
    counter = TokenCounter(memo=CountMemo())
    long = "line one\n" + "word " * 1000
    assert counter.known("hello world") is None and counter.known(long) is None
    assert counter.encoded_chars == 0
    n, m = counter.count("hello world"), counter.count(long)
    assert (counter.known("hello world"), counter.known(long)) == (n, m)
    assert counter.encoded_chars == len("hello world") + len(long)


def test_a_forked_child_counts_on_threads_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """The parent's counting threads are not in a forked child: a pool it inherited would
    queue the work for them and wait forever."""
    import lamina.pipeline._tokens.counter as tokens_module

    monkeypatch.setattr(tokens_module, "PARALLEL_CHARS", 1)
    monkeypatch.setattr(tokens_module, "_workers", lambda: 2)
    texts = [f"text number {i} of the batch" for i in range(40)]
    expected = TokenCounter(memo=CountMemo()).count_many(texts)  # the pool is made here
    assert in_forked_child(lambda: TokenCounter(memo=CountMemo()).count_many(texts)) == expected
