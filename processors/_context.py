"""What a processor may use: the vault, network permissions and a per-conversation cache."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, TypeVar

import attrs

from lamina.pipeline.errors import ConfigError, UnknownSetting
from lamina.processors._vault import Vault

__all__ = ["DISPLAY_PROPERTIES", "NoteOptions", "ProcessContext", "read_settings"]


PropertiesSetting = Literal["auto", "all", "none"] | tuple[str, ...]

DISPLAY_PROPERTIES = ("cssclass", "cssclasses", "permalink", "publish")
"""Keys that only style or publish a note: left out under ``properties="auto"``."""


def _properties(value: Any) -> PropertiesSetting:
    for mode in ("auto", "all", "none"):
        if value == mode:
            return mode
    if isinstance(value, str) or not all(isinstance(k, str) and k for k in value):
        raise ConfigError(
            "properties", f"expected 'auto', 'all', 'none' or a list of keys, not {value!r}"
        )
    return tuple(value)


def _positive(_: Any, attribute: attrs.Attribute[int], value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(attribute.name, f"must be a non-negative integer, not {value!r}")


@attrs.frozen
class NoteOptions:
    """How notes reach the model: which frontmatter properties head the note (``auto``: all
    but ``DISPLAY_PROPERTIES``; ``all``; ``none``; or a list of keys), whether
    ``![[embeds]]`` are inlined (sections always, whole notes up to ``embed_max_chars``,
    ``embed_depth`` levels deep) or kept as links, and whether ``%%comments%%`` are hidden
    (as Obsidian's reading view hides them: an editor's notes, and plugins' data such as
    an Excalidraw drawing's JSON) or kept."""

    properties: PropertiesSetting = attrs.field(default="auto", converter=_properties)
    embeds: Literal["inline", "links"] = "inline"
    embed_max_chars: int = attrs.field(default=4000, validator=_positive)
    embed_depth: int = attrs.field(default=3, validator=_positive)
    comments: Literal["hidden", "kept"] = "hidden"

    def __attrs_post_init__(self) -> None:
        if self.embeds not in ("inline", "links"):
            raise ConfigError("embeds", f"expected 'inline' or 'links', not {self.embeds!r}")
        if self.comments not in ("hidden", "kept"):
            raise ConfigError("comments", f"expected 'hidden' or 'kept', not {self.comments!r}")


@attrs.frozen
class ProcessContext:
    """Settings and shared state handed to every processor call.

    ``options`` are the processors' settings by ``<kind>_<setting>`` (``url_timeout``,
    ``pdf_max_pages``): each processor reads its own as a typed settings class
    (``read_settings``), and a key no processor declares is an ``UnknownSetting``.
    ``pdf_passwords`` (PDF path as attached -> password) opens encrypted PDFs; it is
    never part of a key, a payload, the store or the trace."""

    vault: Vault | None = None
    allow_private_network: bool = False
    allow_absolute_paths: bool = False
    refresh: bool = False
    # Per-conversation cache (e.g. fetched pages by URL); shared by copies on purpose.
    cache: dict[str, Any] = attrs.field(factory=dict, eq=False, repr=False)
    options: Mapping[str, Any] = attrs.field(factory=dict)
    notes: NoteOptions = attrs.field(factory=NoteOptions)
    pdf_passwords: Mapping[str, str] = attrs.field(factory=dict, repr=False, eq=False)


S = TypeVar("S")


def read_settings(options: Mapping[str, Any], kind: str, settings: type[S]) -> S:
    """``kind``'s typed settings from the ``<kind>_<field>`` keys of ``options``; a key
    with the kind's prefix naming no field is an UnknownSetting (naming it and the kind)."""
    prefix = f"{kind}_"
    fields = {a.name for a in attrs.fields(settings)}  # type: ignore[arg-type]
    given: dict[str, Any] = {}
    for key, value in options.items():
        if not key.startswith(prefix):
            continue
        name = key[len(prefix) :]
        if name not in fields:
            raise UnknownSetting(key, kind, sorted(prefix + f for f in fields))
        given[name] = value
    return settings(**given)
