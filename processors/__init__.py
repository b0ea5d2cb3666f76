"""Processors: one per source type, turning attachments into typed artifacts."""

from processors._context import DISPLAY_PROPERTIES, NoteOptions, ProcessContext
from processors._notes import (
    FolderProcessor,
    NotePayload,
    NoteProcessor,
    TagProcessor,
    WikiLink,
    folder,
    note,
    tag,
)
from processors._pdf import PdfPayload, PdfProcessor, parse_page_range, pdf
from processors._registry import ENTRY_POINT_GROUP, Processor, Registry
from processors._selection import SelectionPayload, SelectionProcessor, selection
from processors._sources import Sources
from processors._vault import Vault
from processors._web import UrlPayload, UrlProcessor, normalize_url, url
from processors._youtube import (
    Cue,
    JsonTranscriptProvider,
    SubtitleFileProvider,
    Transcript,
    TranscriptProvider,
    YoutubePayload,
    YoutubeProcessor,
    YoutubeTranscriptApiProvider,
    parse_video_id,
    youtube,
)

__all__ = [
    "DISPLAY_PROPERTIES",
    "ENTRY_POINT_GROUP",
    "Cue",
    "FolderProcessor",
    "JsonTranscriptProvider",
    "NoteOptions",
    "NotePayload",
    "NoteProcessor",
    "PdfPayload",
    "PdfProcessor",
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
    "Vault",
    "WikiLink",
    "YoutubePayload",
    "YoutubeProcessor",
    "YoutubeTranscriptApiProvider",
    "folder",
    "normalize_url",
    "note",
    "parse_page_range",
    "parse_video_id",
    "pdf",
    "selection",
    "tag",
    "url",
    "youtube",
]
