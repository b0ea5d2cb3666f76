"""The processors that ship with Lamina, in registration order."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lamina.processors._processor import Processor

__all__ = ["builtin_processors"]


def builtin_processors() -> list[Processor]:
    from lamina.processors._notes import FolderProcessor, NoteProcessor, TagProcessor
    from lamina.processors._pdf import PdfProcessor
    from lamina.processors._selection import SelectionProcessor
    from lamina.processors._web import UrlProcessor
    from lamina.processors._youtube import YoutubeProcessor

    # This order is the order of a transcript's context line (Notes, URLs, Tags, ...).
    return [
        NoteProcessor(),
        UrlProcessor(),
        TagProcessor(),
        FolderProcessor(),
        YoutubeProcessor(),
        PdfProcessor(),
        SelectionProcessor(),
    ]
