"""Renderers: segment text (XML), provider requests and traces, from typed envelopes."""

from lamina.renderers._agent import (
    AGENT_RENDERERS,
    ANTHROPIC_TOOL_PROMPT,
    agent_request,
    anthropic_tool_prompt,
    instructions_tokens,
    loop_messages,
    tool_tokens,
)
from lamina.renderers._cache import (
    PREVIOUS_NOT_REBUILT,
    PrefixReport,
    classify_break,
    prefix_report,
    prefix_reports,
    prompt_prefix_tokens,
    prompt_tokens,
)
from lamina.renderers._explain import LOW_CACHE_SHARE, explain_cache
from lamina.renderers._judge import (
    FREE_MARGIN,
    ChatFinding,
    ChatJudgement,
    ChatTargets,
    judge_chat,
)
from lamina.renderers._layouts import LAYOUTS, Block, Layout, Message, Prompt, build_prompt
from lamina.renderers._openai import (
    ChatMessage,
    chatml,
    chatml_prefix_tokens,
    common_prefix_length,
    common_prefix_tokens,
    openai_messages,
)
from lamina.renderers._providers import (
    DEFAULT_MODELS,
    CacheRules,
    GeminiCachePlan,
    RenderedRequest,
    RequestOptions,
    anthropic_breakpoints,
    cache_rules,
    gemini_cache_plan,
    prompt_cache_key,
    request_options,
)
from lamina.renderers._replay_report import PROVIDER_COLOURS, render_replay_report
from lamina.renderers._report import REPORT_LAYERS, render_report, report_blocks
from lamina.renderers._requests import (
    RequestRegistry,
    RequestRenderer,
    annotate_trace,
    render_request,
)
from lamina.renderers._simulate import Simulation, format_simulation, simulate
from lamina.renderers._trace import TRACE_VERSION, trace_document, trace_turn
from lamina.renderers._usage import CACHE_MISS, trace_usage, usage_record
from lamina.renderers._xml import XmlRenderer, render_xml, xml_safe

__all__ = [
    "AGENT_RENDERERS",
    "ANTHROPIC_TOOL_PROMPT",
    "CACHE_MISS",
    "DEFAULT_MODELS",
    "FREE_MARGIN",
    "LAYOUTS",
    "LOW_CACHE_SHARE",
    "PREVIOUS_NOT_REBUILT",
    "PROVIDER_COLOURS",
    "REPORT_LAYERS",
    "TRACE_VERSION",
    "Block",
    "CacheRules",
    "ChatFinding",
    "ChatJudgement",
    "ChatMessage",
    "ChatTargets",
    "GeminiCachePlan",
    "Layout",
    "Message",
    "PrefixReport",
    "Prompt",
    "RenderedRequest",
    "RequestOptions",
    "RequestRegistry",
    "RequestRenderer",
    "Simulation",
    "XmlRenderer",
    "agent_request",
    "annotate_trace",
    "anthropic_breakpoints",
    "anthropic_tool_prompt",
    "build_prompt",
    "cache_rules",
    "chatml",
    "chatml_prefix_tokens",
    "classify_break",
    "common_prefix_length",
    "common_prefix_tokens",
    "explain_cache",
    "format_simulation",
    "gemini_cache_plan",
    "instructions_tokens",
    "judge_chat",
    "loop_messages",
    "openai_messages",
    "prefix_report",
    "prefix_reports",
    "prompt_cache_key",
    "prompt_prefix_tokens",
    "prompt_tokens",
    "render_replay_report",
    "render_report",
    "render_request",
    "render_xml",
    "report_blocks",
    "request_options",
    "simulate",
    "tool_tokens",
    "trace_document",
    "trace_turn",
    "trace_usage",
    "usage_record",
    "xml_safe",
]
