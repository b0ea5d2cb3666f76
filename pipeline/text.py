"""Text rules: content hashes, markdown sections, Lamina's block markup and its escaping,
defusing special tokens, and stripping context from replies."""

from lamina.pipeline._hashing import canonical_bytes, content_hash, text_hash
from lamina.pipeline._model.history import has_context_markup, strip_reply
from lamina.pipeline._text.markdown import fence_after, split_sections
from lamina.pipeline._text.markup import (
    MarkupBlock,
    defuse_markup,
    escape_attribute,
    escape_body,
    markup_blocks,
    xml_safe,
)
from lamina.pipeline._text.specials import defuse_special_tokens

__all__ = [
    "MarkupBlock",
    "canonical_bytes",
    "content_hash",
    "defuse_markup",
    "defuse_special_tokens",
    "escape_attribute",
    "escape_body",
    "fence_after",
    "has_context_markup",
    "markup_blocks",
    "split_sections",
    "strip_reply",
    "text_hash",
    "xml_safe",
]
