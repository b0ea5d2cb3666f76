"""Special-token spellings in content, made plain text for every open model alike.

An open model's server renders the request through the model's chat template and
tokenizes the result with special tokens enabled, so content that spells one
(``<|eot_id|>``, ``<|im_end|>``, ``[INST]``, ``</s>``) becomes that control token: the
message ends there, a new role starts, and the model obeys it. Lamina counts text, so it
sends text: a zero-width space (U+200B) goes after the first character of every spelling
any supported family reserves (``<|...|>`` for Llama 3/4 and Qwen's ChatML, Mistral's
``[INST]``-style and ``<s>``-style controls, Qwen's ``<think>``/``<tool_call>`` tags).
The rule is the same whatever the model, so a conversation's texts (and their hashes)
do not depend on which model reads them; the character costs a token or two where a
spelling occurs, and it is counted like any other text.
"""

from __future__ import annotations

import re

__all__ = ["SPECIAL_BREAK", "defuse_special_tokens"]

SPECIAL_BREAK = "\u200b"
"""What goes after the first character of a special-token spelling (a zero-width space)."""

_MISTRAL = (
    "INST|AVAILABLE_TOOLS|TOOL_RESULTS|TOOL_CALLS|TOOL_CONTENT|SYSTEM_PROMPT|THINK"
    "|IMG|IMG_BREAK|IMG_END|PREFIX|MIDDLE|SUFFIX|ARGS|CALL_ID"
)
_TAGS = (
    r"s|unk|pad|SPECIAL_\d+|think|tool_call|tool_response"
    r"|tts_pad|tts_text_bos|tts_text_eod|tts_text_bos_single"
)
_SPECIAL = re.compile(
    r"<\|[^\s<>|]{1,96}\|>"  # Llama 3 / 4, Qwen ChatML: <|eot_id|>, <|im_end|>, <|eot|>
    r"|\[/?(?:" + _MISTRAL + r")\]"  # Mistral: [INST], [/INST], [TOOL_CALLS]
    r"|</?(?:" + _TAGS + r")>"  # <s>, </s> (Mistral, Llama 2); <think>, <tool_call> (Qwen)
)


def defuse_special_tokens(text: str) -> str:
    """``text`` with a zero-width space after the first character of every special-token
    spelling, so no chat template's tokenizer reads one as a control token. Idempotent;
    text without such a spelling is returned as is."""
    if "<" not in text and "[" not in text:
        return text
    return _SPECIAL.sub(lambda m: m[0][0] + SPECIAL_BREAK + m[0][1:], text)
