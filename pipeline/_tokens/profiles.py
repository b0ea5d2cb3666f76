"""Model profiles as data: window, output reserve, tokenizer and caching facts per model.

Figures come from the providers' model pages and caching guides as published up to 2026
(OpenAI model pages, Anthropic models overview and prompt-caching guide, Gemini model
cards and caching guide) and, for open models, from the model cards and the chat templates
their tokenizers ship with. Where sources disagreed, the conservative value is used and a
comment says so. Hosts override any field with ``get_profile(name, field=value)``.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Literal, Protocol, cast

import attrs

from lamina.pipeline._errors import ConfigError
from lamina.pipeline._tokens.counter import TOKENIZERS

__all__ = [
    "ANTHROPIC_WRITE",
    "CACHE_READ",
    "CHAT_TEMPLATES",
    "OPENAI_FRAMING",
    "PROFILES",
    "ChatTemplate",
    "Framing",
    "FramingFields",
    "ModelProfile",
    "Provider",
    "framing_of",
    "generic_profile",
    "get_profile",
    "provider_of",
]

Provider = Literal["openai", "anthropic", "gemini"]
ChatTemplate = Literal["messages", "mistral"]
CHAT_TEMPLATES: tuple[str, ...] = ("messages", "mistral")
"""How a chat template lays out the request: "messages" frames every message alike, the
system message first (OpenAI, Llama, Qwen); "mistral" is Mistral's instruct format (v2/v3):
the system text joins the last user message, consecutive user messages merge (both with a
blank line), ``[INST]``/``[/INST]`` around each user turn and ``</s>`` after each reply."""
_PROVIDERS = ("anthropic", "gemini", "openai")

ANTHROPIC_MARGIN = 0.30
"""Claude's tokenizer is not public. Measured on English prose and code, Claude 3.5 Sonnet
used 20-30% more tokens than GPT-4o's o200k for the same text (more on code and JSON), so
o200k counts are scaled up by 30%. Unverified for newer Claude tokenizers: override it."""

GEMINI_MARGIN = 0.15
"""Gemini's tokenizer (SentencePiece, ~256k entries) is not available offline. Third-party
comparisons put o200k-based estimates within 5-15% for prose and worse for code; we know of
no careful measurement, so 15% is a guess on the safe side. Override it when you measure."""


@attrs.frozen
class Framing:
    """What a chat request adds around its contents, in tokens: per message, once to prime
    the reply, the template's text right before each content (``lead``), whether it strips
    contents, where it puts the system text (``template``, one of ``CHAT_TEMPLATES``) and
    per native tool call (id, type, function wrapper beyond the name and arguments).
    ``default_system`` is the system message's content the template writes when the
    request has none (framed like any message; None: it writes nothing): Qwen2.5's
    default prompt, "" for Llama 3.1's header that always carries its date lines."""

    per_message: int
    priming: int
    lead: str = ""
    trim: bool = False
    template: ChatTemplate = "messages"
    tool_call: int = 8
    default_system: str | None = None


class FramingFields(Protocol):
    """A record that spells a framing out field by field (a profile, a budget)."""

    @property
    def per_message_tokens(self) -> int: ...
    @property
    def priming_tokens(self) -> int: ...
    @property
    def content_lead(self) -> str: ...
    @property
    def trim_content(self) -> bool: ...
    @property
    def chat_template(self) -> str: ...
    @property
    def tool_call_tokens(self) -> int: ...
    @property
    def default_system(self) -> str | None: ...


def framing_of(fields: FramingFields) -> Framing:
    """The ``Framing`` that a profile's or a budget's framing fields describe."""
    return Framing(
        fields.per_message_tokens,
        fields.priming_tokens,
        fields.content_lead,
        fields.trim_content,
        cast(ChatTemplate, fields.chat_template),
        fields.tool_call_tokens,
        fields.default_system,
    )


OPENAI_FRAMING = Framing(3, 3)
"""OpenAI chat framing: 3 tokens per message and 3 to prime the reply; the default."""

CACHE_READ = 0.1
"""What an input token read from the provider's prompt cache costs, as a share of the
plain input price, where a profile says no other: Anthropic's reads, Gemini's implicit and
explicit caches and OpenAI's GPT-5 family all bill 0.1x (a self-hosted server's prefix
cache skips the prefill of what it holds, most of an input token's cost)."""

ANTHROPIC_WRITE = 1.25
"""What Anthropic bills for writing a token into its prompt cache (5-minute TTL), as a share
of the input price: a token it could have read (0.1x) and writes again costs 1.15 more."""

_OPENAI_READ = (("gpt-4o", 0.5), ("gpt-4.1", 0.25), ("o3", 0.25), ("o4", 0.25), ("gpt-5", 0.1))
"""OpenAI's cached-input price as a share of the input price, by model-name prefix (the
model pages); 0.5 for a name none matches (GPT-4o's, the oldest caching models')."""


def _openai_read(name: str) -> float:
    """``name``'s cached-input price (``_OPENAI_READ``)."""
    return next((read for prefix, read in _OPENAI_READ if name.startswith(prefix)), 0.5)


@attrs.frozen
class ModelProfile:
    """What the budget needs to know about one model.

    ``context_window`` bounds input plus output; ``default_output_reserve`` is what the
    budget keeps free for the reply (the ``max_tokens`` a host should send);
    ``exact_tokens`` is True only where the provider's tokenizer runs locally (OpenAI
    o200k/cl100k); otherwise counts are scaled by ``1 + safety_margin``.
    ``min_cacheable_tokens`` is the provider's smallest prefix it will cache;
    ``per_message_tokens`` and ``priming_tokens`` are the chat framing overhead (OpenAI:
    3 per message and 3 to prime the reply; for open models, what their chat template adds
    around each message, and once per request: BOS, the reply header, fixed system text);
    ``content_lead`` is the template's text right before each content in the same run, and
    ``trim_content`` whether the template strips contents (see ``request_tokens``);
    ``chat_template`` says where the system text goes (one of ``CHAT_TEMPLATES``; for
    "mistral", ``per_message_tokens`` frames each user turn and ``priming_tokens`` is ``<s>``);
    ``default_system`` what the template sends as the system message when there is none
    (see ``Framing``); ``cache_read`` and ``cache_write`` what a token read from or written
    into the prompt cache costs, as a share of the input price (``CACHE_READ`` unless the
    provider bills another; writing costs the plain price but at Anthropic's,
    ``ANTHROPIC_WRITE``).
    """

    name: str
    provider: Provider
    context_window: int
    default_output_reserve: int
    tokenizer: str = "o200k_base"
    exact_tokens: bool = True
    safety_margin: float = 0.0
    min_cacheable_tokens: int = 1024
    per_message_tokens: int = OPENAI_FRAMING.per_message
    priming_tokens: int = OPENAI_FRAMING.priming
    max_output_tokens: int | None = None
    content_lead: str = OPENAI_FRAMING.lead
    trim_content: bool = OPENAI_FRAMING.trim
    chat_template: ChatTemplate = OPENAI_FRAMING.template
    tool_call_tokens: int = OPENAI_FRAMING.tool_call
    default_system: str | None = OPENAI_FRAMING.default_system
    cache_read: float = CACHE_READ
    cache_write: float = 1.0

    def __attrs_post_init__(self) -> None:
        problems: list[str] = []
        if self.chat_template not in CHAT_TEMPLATES:
            problems.append(
                f"chat_template {self.chat_template!r} is not one of {', '.join(CHAT_TEMPLATES)}"
            )
        if self.provider not in _PROVIDERS:
            problems.append(f"provider {self.provider!r} is not one of {', '.join(_PROVIDERS)}")
        if self.tokenizer not in TOKENIZERS:
            problems.append(f"tokenizer {self.tokenizer!r} is not one of {', '.join(TOKENIZERS)}")
        if self.context_window <= 0:
            problems.append(f"context_window must be > 0, got {self.context_window}")
        if not 0 <= self.default_output_reserve < self.context_window:
            problems.append(
                f"default_output_reserve must be in [0, context_window), "
                f"got {self.default_output_reserve}"
            )
        if not 0.0 <= self.safety_margin < 1.0:
            problems.append(f"safety_margin must be in [0, 1), got {self.safety_margin}")
        if not 0.0 <= self.cache_read <= 1.0:
            problems.append(f"cache_read must be in [0, 1], got {self.cache_read}")
        if self.cache_write < 1.0:
            problems.append(f"cache_write must be >= 1, got {self.cache_write}")
        if self.exact_tokens and self.safety_margin:
            problems.append("an exact tokenizer needs no safety_margin")
        counts = (self.min_cacheable_tokens, self.per_message_tokens, self.priming_tokens)
        if min(*counts, self.tool_call_tokens) < 0:
            problems.append("token counts must be >= 0")
        if problems:
            raise ConfigError(f"profile {self.name!r}", "; ".join(problems))

    @property
    def input_budget(self) -> int:
        """Tokens left for the whole request once the output reserve is set aside."""
        return self.context_window - self.default_output_reserve

    def effective_tokens(self, counted: int) -> int:
        """A local count scaled to what the provider may bill (unchanged when exact)."""
        if self.exact_tokens:
            return counted
        return math.ceil(counted * (1.0 + self.safety_margin))

    @property
    def framing(self) -> Framing:
        """This model's chat framing (what ``request_tokens`` counts around contents)."""
        return framing_of(self)

    def framing_tokens(self, messages: int) -> int:
        """Chat framing overhead for ``messages`` messages (before margin)."""
        return self.per_message_tokens * messages + self.priming_tokens


def _openai(name: str, window: int, reserve: int, max_out: int) -> ModelProfile:
    # OpenAI caches prompts of 1024+ tokens automatically.
    return ModelProfile(
        name, "openai", window, reserve, max_output_tokens=max_out, cache_read=_openai_read(name)
    )


def _anthropic(name: str, window: int, reserve: int, max_out: int, cache_min: int) -> ModelProfile:
    # Framing overhead of the Messages API is not published; 3 + 3 is a placeholder that
    # the safety margin dwarfs.
    return ModelProfile(
        name,
        "anthropic",
        window,
        reserve,
        exact_tokens=False,
        safety_margin=ANTHROPIC_MARGIN,
        min_cacheable_tokens=cache_min,
        max_output_tokens=max_out,
        cache_write=ANTHROPIC_WRITE,
    )


def _gemini(name: str, window: int, reserve: int, max_out: int, cache_min: int) -> ModelProfile:
    return ModelProfile(
        name,
        "gemini",
        window,
        reserve,
        exact_tokens=False,
        safety_margin=GEMINI_MARGIN,
        min_cacheable_tokens=cache_min,
        max_output_tokens=max_out,
    )


def _open(name: str, window: int, reserve: int, tokenizer: str, framing: Framing) -> ModelProfile:
    # Open models are served behind OpenAI-compatible APIs (vLLM, Ollama, llama.cpp); their
    # tokenizers run locally (an extra), so counts are exact.
    return ModelProfile(
        name,
        "openai",
        window,
        reserve,
        tokenizer=tokenizer,
        per_message_tokens=framing.per_message,
        priming_tokens=framing.priming,
        content_lead=framing.lead,
        trim_content=framing.trim,
        chat_template=framing.template,
        tool_call_tokens=framing.tool_call,
        default_system=framing.default_system,
    )


# Chat-template framing (the Hugging Face chat templates vLLM applies), counted with each
# family's tokenizer (tests render the template and compare):
# Llama 3: <|start_header_id|>role<|end_header_id|>\n\n ... <|eot_id|> = 5 per message;
# <|begin_of_text|> + the assistant header = 5 per request.
# Contents are trimmed and follow "\n\n" in one run.
LLAMA3_FRAMING = Framing(5, 5, "\n\n", trim=True)
# Llama 3.1 and 3.3 templates also open the system message with "Cutting Knowledge Date:
# December 2023\nToday Date: 26 Jul 2024\n\n" (20 tokens), and write that system message
# (header, date lines, <|eot_id|>) even when the request has none: default_system "".
# Llama 3.2's template
# (meta-llama/Llama-3.2-1B-Instruct and -3B-Instruct, tokenizer_config.json chat_template)
# writes strftime_now("%d %b %Y") there instead of the fixed date: every "DD Mon YYYY" date
# (English month names) from 2020 to 2099 is the same 20 tokens (a test checks each day).
LLAMA31_FRAMING = Framing(5, 5 + 20, "\n\n", trim=True, default_system="")
# Llama 4, as llama-models' ChatFormat encodes it: <|header_start|>role<|header_end|>, then
# "\n\n" and the content encoded apart, <|eot|>; BOS + the assistant header.
LLAMA4_FRAMING = Framing(5, 5)
# Qwen (ChatML): <|im_start|>role\n ... <|im_end|>\n = 5; <|im_start|>assistant\n = 3.
# Qwen3's template adds no system message; a reply's reasoning (up to "</think>") is
# dropped from history by Lamina itself (strip_reply), as the template would.
CHATML_FRAMING = Framing(5, 3, "\n")
# Qwen2.5 (and Qwen2.5-Coder) send their default system prompt when the request has none
# (Qwen/Qwen2.5-7B-Instruct tokenizer_config.json chat_template): 16 tokens + 5 framing.
QWEN2_5_DEFAULT_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
QWEN2_5_FRAMING = Framing(5, 3, "\n", default_system=QWEN2_5_DEFAULT_SYSTEM)
# Qwen3.5 and Qwen3.6 (Qwen/Qwen3.5-27B chat_template.jinja, text path, no tools): ChatML
# with every content trimmed; the reply is primed with <|im_start|>assistant\n<think>\n
# (thinking on, the default) = 5. With enable_thinking=false the template adds
# <think>\n\n</think>\n\n instead of <think>\n: priming_tokens=7. The template drops a
# reply's reasoning up to "</think>": Lamina's history already has (strip_reply drops a
# leading reasoning block; any other "</think>" is defused text), so nothing is cut there.
QWEN3_5_FRAMING = Framing(5, 5, "\n", trim=True)
# Mistral instruct v3 with tekken (mistral-common's InstructTokenizerV3, what vLLM's
# --tokenizer-mode mistral runs, and the models' own chat templates): <s>, then
# [INST]user[/INST] per user turn (2), reply</s> (1, MISTRAL_REPLY_END); the system text
# opens the LAST user message (system + "\n\n" + user). Caching: the request's stable prefix
# is <s> and the history only; the system text and the Context Library move behind it
# every turn, so a server's prefix cache never holds them (they are re-read each turn).
MISTRAL_V3_FRAMING = Framing(2, 1, template="mistral")


_ALL = (
    # OpenAI: context window / max output from the model pages.
    _openai("gpt-4o", 128_000, 16_384, 16_384),
    _openai("gpt-4o-mini", 128_000, 16_384, 16_384),
    _openai("gpt-4.1", 1_047_576, 32_768, 32_768),
    _openai("gpt-4.1-mini", 1_047_576, 32_768, 32_768),
    _openai("gpt-4.1-nano", 1_047_576, 32_768, 32_768),
    # Reasoning models: OpenAI suggests keeping >= 25k tokens for reasoning plus output.
    _openai("o3", 200_000, 25_000, 100_000),
    _openai("o4-mini", 200_000, 25_000, 100_000),
    # GPT-5 family: 400k window but at most 272k input tokens, so the reserve is the
    # full 128k output (400k - 128k = 272k).
    _openai("gpt-5", 400_000, 128_000, 128_000),
    _openai("gpt-5-mini", 400_000, 128_000, 128_000),
    _openai("gpt-5-nano", 400_000, 128_000, 128_000),
    # Anthropic: 200k windows (Sonnet 4/4.5 offer 1M in beta; override context_window).
    # Input + max_tokens must fit the window, so the reserve is a default max_tokens.
    # Cache minimums from the prompt-caching guide.
    _anthropic("claude-opus-4", 200_000, 16_384, 32_000, 1024),
    _anthropic("claude-opus-4-1", 200_000, 16_384, 32_000, 1024),
    _anthropic("claude-opus-4-5", 200_000, 16_384, 64_000, 4096),
    _anthropic("claude-opus-4-6", 1_000_000, 16_384, 128_000, 4096),
    _anthropic("claude-sonnet-4", 200_000, 16_384, 64_000, 1024),
    _anthropic("claude-sonnet-4-5", 200_000, 16_384, 64_000, 1024),
    # Sources disagree on Sonnet 4.6's cache minimum (1024 or 2048): the larger is used.
    _anthropic("claude-sonnet-4-6", 1_000_000, 16_384, 64_000, 2048),
    _anthropic("claude-haiku-4-5", 200_000, 16_384, 64_000, 4096),
    _anthropic("claude-3-5-haiku", 200_000, 8_192, 8_192, 2048),
    # Gemini: 1,048,576 is the input limit and 65,536 the output limit. Treating the input
    # limit as the whole window under-uses it by the reserve, which errs on the safe side.
    # Implicit-cache minimums changed across doc revisions (1024/4096, later 2048/2048);
    # the latest revision's 2048 is used for both.
    _gemini("gemini-2.5-pro", 1_048_576, 65_536, 65_536, 2048),
    _gemini("gemini-2.5-flash", 1_048_576, 65_536, 65_536, 2048),
    # Llama (tokenizer from the `llama` extra): windows from Meta's model cards.
    _open("llama-3-8b-instruct", 8_192, 1_024, "llama3", LLAMA3_FRAMING),
    _open("llama-3-70b-instruct", 8_192, 1_024, "llama3", LLAMA3_FRAMING),
    _open("llama-3.1-8b-instruct", 131_072, 8_192, "llama3", LLAMA31_FRAMING),
    _open("llama-3.1-70b-instruct", 131_072, 8_192, "llama3", LLAMA31_FRAMING),
    _open("llama-3.1-405b-instruct", 131_072, 8_192, "llama3", LLAMA31_FRAMING),
    _open("llama-3.2-1b-instruct", 131_072, 8_192, "llama3", LLAMA31_FRAMING),
    _open("llama-3.2-3b-instruct", 131_072, 8_192, "llama3", LLAMA31_FRAMING),
    _open("llama-3.3-70b-instruct", 131_072, 8_192, "llama3", LLAMA31_FRAMING),
    # Scout's card says 10M tokens and Maverick's 1M; servers often configure less
    # (override context_window to the server's --max-model-len).
    _open("llama-4-scout-17b-16e-instruct", 10_000_000, 16_384, "llama4", LLAMA4_FRAMING),
    _open("llama-4-maverick-17b-128e-instruct", 1_000_000, 16_384, "llama4", LLAMA4_FRAMING),
    # Qwen (the `qwen` extra): the native 32,768 window (YaRN extends it to 131,072; override).
    _open("qwen2.5-7b-instruct", 32_768, 8_192, "qwen2", QWEN2_5_FRAMING),
    _open("qwen2.5-14b-instruct", 32_768, 8_192, "qwen2", QWEN2_5_FRAMING),
    _open("qwen2.5-32b-instruct", 32_768, 8_192, "qwen2", QWEN2_5_FRAMING),
    _open("qwen2.5-72b-instruct", 32_768, 8_192, "qwen2", QWEN2_5_FRAMING),
    _open("qwen2.5-coder-32b-instruct", 32_768, 8_192, "qwen2", QWEN2_5_FRAMING),
    _open("qwen3-8b", 32_768, 8_192, "qwen2", CHATML_FRAMING),
    _open("qwen3-14b", 32_768, 8_192, "qwen2", CHATML_FRAMING),
    _open("qwen3-32b", 32_768, 8_192, "qwen2", CHATML_FRAMING),
    _open("qwen3-30b-a3b", 32_768, 8_192, "qwen2", CHATML_FRAMING),
    _open("qwen3-235b-a22b", 32_768, 8_192, "qwen2", CHATML_FRAMING),
    # Qwen3.5 / 3.6: a native 262,144 window; Qwen suggests 32,768 output tokens for
    # thinking replies, the reserve here.
    _open("qwen3.5-27b", 262_144, 32_768, "qwen3_5", QWEN3_5_FRAMING),
    _open("qwen3.5-35b-a3b", 262_144, 32_768, "qwen3_5", QWEN3_5_FRAMING),
    _open("qwen3.5-397b-a17b", 262_144, 32_768, "qwen3_5", QWEN3_5_FRAMING),
    _open("qwen3.6-27b", 262_144, 32_768, "qwen3_5", QWEN3_5_FRAMING),
    _open("qwen3.6-35b-a3b", 262_144, 32_768, "qwen3_5", QWEN3_5_FRAMING),
    # Mistral (the `mistral` extra), the models mistral-common encodes with tekken v3:
    # 128k windows from the model cards (servers often set less: override context_window).
    # Pixtral's tekken file has the same vocabulary and pattern (text counts are the same).
    _open("mistral-nemo-instruct-2407", 131_072, 8_192, "tekken", MISTRAL_V3_FRAMING),
    _open("ministral-8b-instruct-2410", 131_072, 8_192, "tekken", MISTRAL_V3_FRAMING),
    _open("pixtral-12b-2409", 131_072, 8_192, "tekken", MISTRAL_V3_FRAMING),
)

PROFILES: Mapping[str, ModelProfile] = MappingProxyType({p.name: p for p in _ALL})
"""Built-in profiles by model name (aliases without a date suffix)."""

_DATE_SUFFIX = re.compile(r"-(?:\d{8}|\d{4}-\d{2}-\d{2}|latest)$")
_FIELDS = frozenset(a.name for a in attrs.fields(ModelProfile)) - {"name"}


def get_profile(name: str, **overrides: Any) -> ModelProfile:
    """The profile for ``name`` (dated snapshots such as ``gpt-4o-2024-08-06`` resolve to
    their alias), with ``overrides`` applied; unknown names or fields raise ``ConfigError``."""
    profile = PROFILES.get(name) or PROFILES.get(_DATE_SUFFIX.sub("", name))
    if profile is None:
        close = difflib.get_close_matches(name, sorted(PROFILES), n=3, cutoff=0.6)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ConfigError("model", f"unknown model {name!r}{hint} (known: {', '.join(PROFILES)})")
    unknown = sorted(set(overrides) - _FIELDS)
    if unknown:
        raise ConfigError(
            "model",
            f"unknown profile field(s) {', '.join(unknown)} for {name!r} "
            f"(known: {', '.join(sorted(_FIELDS))})",
        )
    if not overrides:
        return profile
    if overrides.get("exact_tokens") is True and "safety_margin" not in overrides:
        overrides["safety_margin"] = 0.0
    return attrs.evolve(profile, **overrides)


# Model-name prefixes of each provider's API models (after any "provider/" route prefix).
_NAME_PREFIXES: tuple[tuple[str, Provider], ...] = (
    ("claude", "anthropic"),
    ("gemini", "gemini"),
    ("gpt-", "openai"),
    ("chatgpt-", "openai"),
    ("ft:gpt-", "openai"),
    ("o1", "openai"),
    ("o3", "openai"),
    ("o4", "openai"),
)
_ROUTES: Mapping[str, Provider] = MappingProxyType(
    {"openai": "openai", "anthropic": "anthropic", "gemini": "gemini", "google": "gemini"}
)


def provider_of(name: str) -> Provider | None:
    """The provider whose API serves ``name``, from the name alone (``claude-*``,
    ``gemini-*``, ``gpt-*``/``o1``/``o3``/``o4``, or a ``provider/`` route prefix such as
    LiteLLM's); None when the name says nothing."""
    profile = PROFILES.get(name) or PROFILES.get(_DATE_SUFFIX.sub("", name))
    if profile is not None:
        return profile.provider
    route, _, rest = name.rpartition("/")
    if route.split("/")[0] in _ROUTES:
        return _ROUTES[route.split("/")[0]]
    base = (rest or name).lower()
    return next((p for prefix, p in _NAME_PREFIXES if base.startswith(prefix)), None)


def _openai_tokenizer(name: str) -> str:
    from tiktoken.model import encoding_name_for_model

    try:
        found = encoding_name_for_model(name.rpartition("/")[2])
    except KeyError:
        return "o200k_base"
    return found if found in TOKENIZERS else "o200k_base"


def generic_profile(name: str, provider: str) -> ModelProfile:
    """A profile for a model Lamina has none for, from its provider's generic rules.

    OpenAI: tiktoken's encoding for the name (exact counts), a 128k window, 1,024-token
    cache minimum. Anthropic: o200k + ``ANTHROPIC_MARGIN``, a 200k window, 1,024 (2,048
    for Haiku models, the guide's larger minimum). Gemini: o200k + ``GEMINI_MARGIN``, the
    1M window, 2,048. Good enough to read usage back and predict caching; a budget for the
    model should still set its window (``Budget(context_window=...)``).
    """
    if provider == "openai":
        return ModelProfile(
            name, "openai", 128_000, 16_384, _openai_tokenizer(name), cache_read=_openai_read(name)
        )
    if provider == "anthropic":
        minimum = 2048 if "haiku" in name else 1024
        return _anthropic(name, 200_000, 8_192, 8_192, minimum)
    if provider == "gemini":
        return _gemini(name, 1_048_576, 65_536, 65_536, 2048)
    raise ConfigError("provider", f"unknown provider {provider!r} (known: {', '.join(_PROVIDERS)})")
