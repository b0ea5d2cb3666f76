"""Renderers: segment text (XML), provider requests and traces, from typed envelopes."""

from renderers._openai import ChatMessage, chatml, common_prefix_tokens, openai_messages
from renderers._trace import TRACE_VERSION, trace_document, trace_turn
from renderers._xml import XmlRenderer, render_xml, xml_safe

__all__ = [
    "TRACE_VERSION",
    "ChatMessage",
    "XmlRenderer",
    "chatml",
    "common_prefix_tokens",
    "openai_messages",
    "render_xml",
    "trace_document",
    "trace_turn",
    "xml_safe",
]
