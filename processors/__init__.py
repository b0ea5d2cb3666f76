"""Processors: one per source type, turning attachments into typed artifacts."""

from lamina.processors._context import (
    DISPLAY_PROPERTIES,
    NoteOptions,
    ProcessContext,
    read_settings,
)
from lamina.processors._notes import (
    FolderProcessor,
    NotePayload,
    NoteProcessor,
    TagProcessor,
    WikiLink,
    folder,
    note,
    tag,
)
from lamina.processors._pdf import PdfPayload, PdfProcessor, PdfSettings, parse_page_range, pdf
from lamina.processors._registry import (
    ENTRY_POINT_GROUP,
    BaseProcessor,
    Processor,
    Registry,
    plugin_scans,
    reload_plugins,
)
from lamina.processors._selection import SelectionPayload, SelectionProcessor, selection
from lamina.processors._sources import Sources
from lamina.processors._vault import Vault
from lamina.processors._web import UrlPayload, UrlProcessor, UrlSettings, normalize_url, url
from lamina.processors._youtube import (
    Cue,
    JsonTranscriptProvider,
    SubtitleFileProvider,
    Transcript,
    TranscriptProvider,
    YoutubePayload,
    YoutubeProcessor,
    YoutubeSettings,
    YoutubeTranscriptApiProvider,
    parse_video_id,
    youtube,
)

__all__ = [
    "DISPLAY_PROPERTIES",
    "ENTRY_POINT_GROUP",
    "BaseProcessor",
    "Cue",
    "FolderProcessor",
    "JsonTranscriptProvider",
    "NoteOptions",
    "NotePayload",
    "NoteProcessor",
    "PdfPayload",
    "PdfProcessor",
    "PdfSettings",
    "ProcessContext",
    "Processor",
    "Registry",
    "SelectionPayload",
    "SelectionProcessor",
    "Sources",
    "SubtitleFileProvider",
    "TagProcessor",
    "Transcript",
    "TranscriptProvider",
    "UrlPayload",
    "UrlProcessor",
    "UrlSettings",
    "Vault",
    "WikiLink",
    "YoutubePayload",
    "YoutubeProcessor",
    "YoutubeSettings",
    "YoutubeTranscriptApiProvider",
    "folder",
    "normalize_url",
    "note",
    "parse_page_range",
    "parse_video_id",
    "pdf",
    "plugin_scans",
    "read_settings",
    "reload_plugins",
    "selection",
    "tag",
    "url",
    "youtube",
]
