"""YouTube videos: video ids from every common URL form, transcripts from providers."""

from __future__ import annotations

import html
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, Self, runtime_checkable
from urllib.parse import parse_qs, urlsplit

import attrs

from lamina.pipeline.errors import AttachmentError, ConfigError, PathOutsideVault, TranscriptError
from lamina.pipeline.inputs import (
    FileProblem,
    LoadError,
    LoadLimits,
    load_json,
    read_confined,
    read_regular,
)
from lamina.pipeline.sources import LabelLookup, Processed, TurnWarning, make_artifact
from lamina.processors._context import ProcessContext, read_settings
from lamina.processors._processor import BaseProcessor
from lamina.processors._web import fetch_for_label

__all__ = [
    "Cue",
    "JsonTranscriptProvider",
    "SubtitleFileProvider",
    "Transcript",
    "TranscriptProvider",
    "YoutubePayload",
    "YoutubeProcessor",
    "YoutubeSettings",
    "YoutubeSpec",
    "YoutubeTranscriptApiProvider",
    "parse_video_id",
    "youtube",
]

_ID = re.compile(r"[A-Za-z0-9_-]{11}")
_HOSTS = frozenset({"youtube.com", "youtu.be", "youtube-nocookie.com"})
_HOST_PREFIXES = ("www.", "m.", "music.")
_PATH_FORMS = frozenset({"shorts", "embed", "live", "v", "e"})
_MAX_TRANSCRIPT_BYTES = 20_000_000
_JSON_LIMITS = LoadLimits(max_chars=_MAX_TRANSCRIPT_BYTES, max_nodes=2_000_000)
_SECTION_MS = 5 * 60 * 1000
_PARAGRAPH_MS = 30_000
_PARAGRAPH_HARD_MS = 60_000
_PARAGRAPH_GAP_MS = 3_000
_MERGE_GAP_MS = 500
_MAX_OVERLAP_WORDS = 40  # bounds the overlap search, so one huge cue cannot stall
NO_TRANSCRIPT = "No transcript available."


def parse_video_id(u: str) -> str:
    """The 11-character video id of a YouTube URL (any common form) or a bare id."""
    if not isinstance(u, str):
        raise TranscriptError(repr(u)[:80], "a YouTube reference must be a string")
    text = u.strip()
    if _ID.fullmatch(text):
        return text
    video = _id_from_url(text)
    if video is None:
        raise TranscriptError(u[:200], "not a YouTube video URL or an 11-character video id")
    return video


def _id_from_url(text: str) -> str | None:
    if "://" not in text:
        text = "https://" + text
    try:
        parts = urlsplit(text)
        host = (parts.hostname or "").lower()
    except ValueError:
        return None
    if parts.scheme.lower() not in ("http", "https"):
        return None
    for prefix in _HOST_PREFIXES:
        if host.startswith(prefix):
            host = host[len(prefix) :]
            break
    if host not in _HOSTS:
        return None
    segments = [s for s in parts.path.split("/") if s]
    candidate: str | None = None
    if host == "youtu.be":
        candidate = segments[0] if len(segments) == 1 else None
    elif host == "youtube-nocookie.com":
        if len(segments) == 2 and segments[0] == "embed":
            candidate = segments[1]
    elif segments == ["watch"]:
        values = parse_qs(parts.query).get("v", [])
        candidate = values[0] if len(values) == 1 else None
    elif len(segments) == 2 and segments[0] in _PATH_FORMS:
        candidate = segments[1]
    # "videoseries" (a playlist embed) happens to be 11 id-like characters.
    if candidate is not None and candidate != "videoseries" and _ID.fullmatch(candidate):
        return candidate
    return None


def watch_url(video_id: str) -> str:
    return f"https://www.youtube.com/watch?v={video_id}"


# --- transcripts -------------------------------------------------------------


@attrs.frozen
class Cue:
    """One caption: start and end in milliseconds and its cleaned text."""

    start_ms: int
    end_ms: int
    text: str


@attrs.frozen
class Transcript:
    """What a provider returns: cues plus whatever metadata the source knows."""

    cues: tuple[Cue, ...]
    language: str = ""
    title: str = ""
    channel: str = ""
    duration_s: int | None = None
    problems: tuple[str, ...] = ()  # sentences: what the reader skipped (broken cues)


@runtime_checkable
class TranscriptProvider(Protocol):
    """Finds a video's transcript; ``None`` means the video has none."""

    def fetch(self, video_id: str) -> Transcript | None: ...


_TAG = re.compile(r"<[^<>]*>")
_ASS_TAG = re.compile(r"\{\\[^{}]*\}")
_INVISIBLE = re.compile("[\ufeff\u200b\u200c\u200d\u2060]")
_SPACE = re.compile(r"\s+")


def clean_cue_text(text: str) -> str:
    """Caption text without styling or timing tags, entities decoded, one line."""
    text = _TAG.sub(" ", text)
    text = _ASS_TAG.sub(" ", text)
    text = html.unescape(text)
    text = _INVISIBLE.sub("", text)
    return _SPACE.sub(" ", text).strip()


def _clean_lines(raw: str) -> list[str]:
    lines = (clean_cue_text(line) for line in raw.splitlines())
    return [line for line in lines if line]


def merge_cues(cues: Iterable[tuple[int, int, Sequence[str]]]) -> tuple[Cue, ...]:
    """Cues in time order with rolling / overlapping auto-caption repeats merged away.

    Each input is (start_ms, end_ms, cleaned lines). A line equal to one of the
    previous cue's lines is dropped (YouTube's rolling two-line captions), a cue
    that only repeats the previous one extends it, and words the next cue repeats
    from the end of the previous one (caption overlap) are dropped.
    """
    ordered = sorted(cues, key=lambda c: (c[0], c[1]))
    out: list[Cue] = []
    prev_lines: list[str] = []
    for start, end, lines in ordered:
        end = max(end, start)
        near = bool(out) and start <= out[-1].end_ms + _MERGE_GAP_MS
        kept = [line for line in lines if not (near and line in prev_lines)]
        prev_lines = list(lines)
        text = " ".join(kept)
        if not text:
            if near and out:
                out[-1] = attrs.evolve(out[-1], end_ms=max(out[-1].end_ms, end))
            continue
        if near and out:
            last = out[-1]
            if _ends_with_words(last.text, text):
                out[-1] = attrs.evolve(last, end_ms=max(last.end_ms, end))
                continue
            if text.startswith(last.text + " "):
                # A caption growing word by word: the longer one replaces the shorter.
                out[-1] = Cue(last.start_ms, max(last.end_ms, end), text)
                continue
            overlap = _word_overlap(last.text.split(" "), text.split(" "), start < last.end_ms)
            if overlap:
                text = " ".join(text.split(" ")[overlap:])
        out.append(Cue(start, end, text))
    return tuple(out)


def _ends_with_words(text: str, tail: str) -> bool:
    words, tail_words = text.casefold().split(" "), tail.casefold().split(" ")
    return words[-len(tail_words) :] == tail_words


def _word_overlap(prev: list[str], new: list[str], overlapping_in_time: bool) -> int:
    """Words at the start of ``new`` that repeat the end of ``prev`` (0 if none)."""
    least = 1 if overlapping_in_time else 2
    for k in range(min(len(prev), len(new) - 1, _MAX_OVERLAP_WORDS), least - 1, -1):
        if [w.casefold() for w in prev[-k:]] == [w.casefold() for w in new[:k]]:
            return k
    return 0


def _read_text(path: Path, label: str, root: Path | None = None) -> str:
    """The file's text; with ``root``, ``path`` is vault-relative and opened from the vault's
    folder (no symlink race). Only a regular file is read: a FIFO or device is refused."""
    try:
        if root is not None:
            data = read_confined(root, path.as_posix(), _MAX_TRANSCRIPT_BYTES)
        else:
            data = read_regular(path, _MAX_TRANSCRIPT_BYTES)
    except FileProblem as exc:
        if exc.reason == "outside":
            raise PathOutsideVault(label, exc.detail) from None
        problem = {
            "missing": "transcript file not found",
            "directory": "transcript path is a directory",
            "too-large": f"transcript file is over {_MAX_TRANSCRIPT_BYTES} bytes",
        }.get(exc.reason, f"cannot read transcript file: {exc.detail}")
        raise TranscriptError(label, problem) from None
    try:
        if data.startswith((b"\xff\xfe", b"\xfe\xff")):
            return data.decode("utf-16")
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise TranscriptError(
            label, "transcript file is not UTF-8 (or UTF-16 with a BOM)"
        ) from None


@attrs.frozen
class SubtitleFileProvider:
    """Reads a local WebVTT or SRT file (format from the suffix, else sniffed) with webvtt-py;
    a WebVTT header may carry ``Language:``, ``Title:`` and ``Channel:`` lines."""

    path: Path
    label: str = ""
    root: Path | None = None  # set: ``path`` is relative to this vault root

    def fetch(self, video_id: str) -> Transcript | None:
        import webvtt
        from webvtt.errors import MalformedCaptionError, MalformedFileError

        label = self.label or str(self.path)
        text = _INVISIBLE.sub("", _read_text(self.path, label, self.root), count=1)
        fmt = self._format(text)
        try:
            parsed = webvtt.WebVTT.from_buffer([text], format=fmt)
            raw = [
                (
                    c.start_time.in_milliseconds(),
                    c.end_time.in_milliseconds(),
                    _clean_lines(c.raw_text),
                )
                for c in parsed.captions
            ]
        except (MalformedFileError, MalformedCaptionError, ValueError) as exc:
            raise TranscriptError(label, f"not a valid {fmt.upper()} file: {exc}") from None
        # WebVTT header lines like YouTube's "Language: en"; "Title:" and "Channel:" too.
        header: dict[str, str] = {}
        for line in getattr(parsed, "metadata", None) or ():
            name, _, value = str(line).partition(":")
            header.setdefault(name.strip().lower(), clean_cue_text(value))
        broken = _broken_cues(text)
        problems: tuple[str, ...] = ()
        if broken and len(raw) < _cue_blocks(text):
            lines = ", ".join(str(n) for n in broken[:5]) + (", ..." if len(broken) > 5 else "")
            cues = "1 cue was" if len(broken) == 1 else f"{len(broken)} cues were"
            problems = (f"{cues} skipped: unreadable timing line (line {lines} of the file)",)
        return Transcript(
            merge_cues(raw),
            language=header.get("language", ""),
            title=header.get("title", ""),
            channel=header.get("channel", ""),
            problems=problems,
        )

    def _format(self, text: str) -> str:
        suffix = self.path.suffix.lower()
        if suffix in (".vtt", ".srt"):
            return suffix[1:]
        return "vtt" if text.lstrip().startswith("WEBVTT") else "srt"


_TIMING = re.compile(
    r"^\s*(?:\d+:)?\d{1,2}:\d{2}[.,]\d{3}\s+-->\s+(?:\d+:)?\d{1,2}:\d{2}[.,]\d{3}(?:\s|$)"
)
_NOT_CUES = ("WEBVTT", "NOTE", "STYLE", "REGION")


def _blocks(text: str) -> list[tuple[int, list[str]]]:
    """Blank-line separated blocks of a subtitle file: (first line number, lines)."""
    blocks: list[tuple[int, list[str]]] = []
    current: list[str] = []
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip():
            if not current:
                blocks.append((number, current))
            current.append(line)
        else:
            current = []
    return [(n, lines) for n, lines in blocks if lines and not lines[0].startswith(_NOT_CUES)]


def _cue_blocks(text: str) -> int:
    return len(_blocks(text))


def _broken_cues(text: str) -> list[int]:
    """Line numbers of cue blocks whose timing line cannot be read (webvtt-py skips them)."""
    broken: list[int] = []
    for number, lines in _blocks(text):
        # The timing line is the first line, or the second after a cue id / SRT index.
        if not any(_TIMING.match(line) for line in lines[:2]):
            timing = 1 if len(lines) > 1 and "-->" in lines[1] else 0
            broken.append(number + timing)
    return broken


@attrs.frozen
class JsonTranscriptProvider:
    """Reads a JSON transcript: a list of {"start", "duration" or "end", "text"} (seconds),
    or an object with metadata ("title", "channel", "language", "duration") and "cues"."""

    path: Path
    label: str = ""
    root: Path | None = None  # set: ``path`` is relative to this vault root

    def fetch(self, video_id: str) -> Transcript | None:
        label = self.label or str(self.path)
        try:
            data = load_json(_read_text(self.path, label, self.root), _JSON_LIMITS)
        except LoadError as exc:
            raise TranscriptError(label, str(exc)) from None
        return transcript_from_json(data, label)


def transcript_from_json(data: Any, label: str) -> Transcript:
    """A transcript from decoded JSON (the list form or the object-with-header form)."""
    header: Mapping[str, Any] = {}
    items = data
    if isinstance(data, Mapping):
        header = data
        items = data.get("cues", data.get("transcript"))
    if not isinstance(items, list):
        raise TranscriptError(label, "a JSON transcript must be a list of cues or hold 'cues'")
    raw: list[tuple[int, int, list[str]]] = []
    for i, item in enumerate(items):
        if not isinstance(item, Mapping):
            raise TranscriptError(label, f"cue {i} is not an object")
        text, start = item.get("text"), _seconds(item.get("start"))
        if not isinstance(text, str) or start is None:
            raise TranscriptError(label, f"cue {i} needs a 'text' string and a 'start' number")
        end = _seconds(item.get("end"))
        if end is None:
            length = _seconds(item.get("duration"))
            end = start + (length if length is not None else 0.0)
        raw.append((round(start * 1000), round(end * 1000), _clean_lines(text)))
    duration = _duration_seconds(header.get("duration", header.get("duration_s")))
    return Transcript(
        merge_cues(raw),
        language=_str(header.get("language")),
        title=_str(header.get("title")),
        channel=_str(header.get("channel")),
        duration_s=duration,
    )


_MAX_SECONDS = 10**9  # about 31 years: beyond it a time is nonsense, not a long video


def _seconds(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if 0 <= value <= _MAX_SECONDS else None


def _str(value: Any) -> str:
    return value.strip() if isinstance(value, str) else ""


def _duration_seconds(value: Any) -> int | None:
    """Seconds from a number or "ss", "mm:ss", "h:mm:ss"; None when absent or invalid."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return round(value) if 0 <= value <= _MAX_SECONDS else None
    if isinstance(value, str) and re.fullmatch(r"\d{1,9}(:\d{1,2}){0,2}", value.strip()):
        total = 0
        for part in value.strip().split(":"):
            total = total * 60 + int(part)
        return total
    return None


@attrs.frozen
class YoutubeTranscriptApiProvider:
    """Fetches transcripts over the network with youtube-transcript-api (extra ``youtube``)."""

    languages: tuple[str, ...] = ("en",)

    def fetch(self, video_id: str) -> Transcript | None:
        try:
            import youtube_transcript_api as yta
        except ImportError:
            raise TranscriptError(
                video_id,
                "youtube-transcript-api is not installed; install it with "
                "`pip install 'lamina[youtube]'` or attach a local transcript file",
            ) from None
        try:
            fetched = yta.YouTubeTranscriptApi().fetch(video_id, languages=list(self.languages))
        except (yta.NoTranscriptFound, yta.TranscriptsDisabled):
            return None
        except Exception as exc:  # network or YouTube-side failure of any kind
            raise TranscriptError(
                video_id, f"could not fetch the transcript: {type(exc).__name__}"
            ) from exc
        raw = [
            (
                round(float(s.start) * 1000),
                round((float(s.start) + float(s.duration)) * 1000),
                _clean_lines(str(s.text)),
            )
            for s in fetched
        ]
        return Transcript(merge_cues(raw), language=str(getattr(fetched, "language_code", "")))


# --- payload -----------------------------------------------------------------


def format_timestamp(ms: int) -> str:
    """``mm:ss`` below an hour, ``h:mm:ss`` from an hour on."""
    seconds = max(ms, 0) // 1000
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes:02d}:{secs:02d}"


@attrs.frozen
class YoutubePayload:
    """A video: its id, metadata when known, and the transcript cues (possibly none)."""

    video_id: str
    title: str
    channel: str
    duration_s: int | None
    language: str
    cues: tuple[Cue, ...]
    has_transcript: bool

    @property
    def locator(self) -> str:
        return watch_url(self.video_id)

    def body(self) -> str:
        """Paragraphs with ``[mm:ss]`` markers; a ``## [mm:ss]`` heading per 5 minutes
        when the transcript runs past the first five, so previews cut into time sections."""
        if not self.has_transcript or not self.cues:
            return NO_TRANSCRIPT
        sectioned = self.cues[-1].start_ms >= _SECTION_MS
        blocks: list[str] = []
        section = -1
        para: list[Cue] = []

        def flush() -> None:
            if para:
                text = " ".join(c.text for c in para)
                blocks.append(f"[{format_timestamp(para[0].start_ms)}] {text}")
                para.clear()

        for cue in self.cues:
            cue_section = cue.start_ms // _SECTION_MS
            if sectioned and cue_section != section:
                flush()
                section = cue_section
                blocks.append(f"## [{format_timestamp(cue_section * _SECTION_MS)}]")
            elif para and _breaks_paragraph(para, cue):
                flush()
            para.append(cue)
        flush()
        return "\n\n".join(blocks)

    def attributes(self) -> tuple[tuple[str, str], ...]:
        attributes: list[tuple[str, str]] = [("url", watch_url(self.video_id))]
        if self.channel:
            attributes.append(("channel", self.channel))
        if self.duration_s is not None:
            attributes.append(("duration", format_timestamp(self.duration_s * 1000)))
        return tuple(attributes)

    def replace_text(self, fn: Callable[[str], str]) -> Self:
        return attrs.evolve(
            self,
            title=fn(self.title),
            channel=fn(self.channel),
            cues=tuple(attrs.evolve(c, text=fn(c.text)) for c in self.cues),
        )


def _breaks_paragraph(para: Sequence[Cue], cue: Cue) -> bool:
    elapsed = cue.start_ms - para[0].start_ms
    if cue.start_ms - para[-1].end_ms >= _PARAGRAPH_GAP_MS or elapsed >= _PARAGRAPH_HARD_MS:
        return True
    return elapsed >= _PARAGRAPH_MS and para[-1].text.endswith((".", "?", "!", "…"))


# --- spec and processor ------------------------------------------------------


@attrs.frozen
class YoutubeSpec:
    """A YouTube video to attach, with an optional local transcript file and metadata."""

    video_id: str
    transcript: str | None = None
    title: str = ""
    channel: str = ""
    language: str = ""
    duration_s: int | None = None
    kind: str = attrs.field(default="youtube", init=False)

    def describe(self) -> str:
        return f"youtube {self.video_id}"


def youtube(
    u: str,
    transcript: str | None = None,
    *,
    title: str = "",
    channel: str = "",
    language: str = "",
    duration: int | str | None = None,
) -> YoutubeSpec:
    """Attach a YouTube video by URL or id; ``transcript`` is a .vtt/.srt/.json file."""
    video_id = parse_video_id(u)
    if transcript is not None and (not isinstance(transcript, str) or not transcript.strip()):
        raise TranscriptError(video_id, "'transcript' must be a non-empty path")
    duration_s = None
    if duration is not None:
        duration_s = _duration_seconds(duration)
        if duration_s is None:
            raise TranscriptError(
                video_id, f"'duration' must be seconds or mm:ss, not {duration!r}"
            )
    return YoutubeSpec(
        video_id,
        transcript,
        title=_str(title),
        channel=_str(channel),
        language=_str(language),
        duration_s=duration_s,
    )


_SCRIPT_FIELDS = frozenset({"youtube", "transcript", "title", "channel", "language", "duration"})


def _provider_setting(_: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value in (None, "", "none", "youtube-transcript-api"):
        return
    if not isinstance(value, TranscriptProvider):
        raise ConfigError(
            "youtube_provider",
            f"expected a TranscriptProvider or 'youtube-transcript-api', not {value!r}",
        )


@attrs.frozen
class YoutubeSettings:
    """Where transcripts come from without a file: ``youtube_provider`` (a
    TranscriptProvider, or "youtube-transcript-api" asking in ``youtube_languages``)."""

    provider: TranscriptProvider | str | None = attrs.field(
        default=None, validator=_provider_setting
    )
    languages: tuple[str, ...] = attrs.field(default=("en",), converter=tuple)


class YoutubeProcessor(BaseProcessor):
    """YouTube videos. Without a transcript file the ``provider`` is asked (none by default,
    so nothing touches the network unless the host opts in); failures give a
    no-transcript artifact with a warning rather than failing the turn."""

    kind = "youtube"
    category = "YouTube"
    settings = YoutubeSettings

    def __init__(self, provider: TranscriptProvider | None = None) -> None:
        self.provider = provider

    def parse(self, data: Mapping[str, Any]) -> YoutubeSpec:
        unknown = sorted(set(data) - _SCRIPT_FIELDS)
        if unknown:
            raise AttachmentError(
                f"youtube {data.get('youtube')!r}", f"unknown fields: {', '.join(unknown)}"
            )
        for name in ("title", "channel", "language"):
            if name in data and not isinstance(data[name], str):
                raise AttachmentError(f"youtube {data['youtube']!r}", f"'{name}' must be a string")
        return youtube(
            data["youtube"],
            data.get("transcript"),
            title=data.get("title", ""),
            channel=data.get("channel", ""),
            language=data.get("language", ""),
            duration=data.get("duration"),
        )

    def script_form(self, spec: YoutubeSpec) -> dict[str, Any]:
        """The video id, with the transcript file and metadata that were given."""
        form: dict[str, Any] = {"youtube": spec.video_id}
        fields = (
            ("transcript", spec.transcript),
            ("title", spec.title),
            ("channel", spec.channel),
            ("language", spec.language),
            ("duration", spec.duration_s),
        )
        form.update((name, value) for name, value in fields if value not in (None, ""))
        return form

    def from_label(
        self, label: str, lookup: LabelLookup, ctx: ProcessContext
    ) -> tuple[dict[str, Any], str]:
        return fetch_for_label("youtube", label, lookup)

    def process(self, spec: YoutubeSpec, ctx: ProcessContext) -> Processed:
        warnings: tuple[TurnWarning, ...] = ()
        if spec.transcript is not None:
            transcript = file_provider(spec.transcript, ctx).fetch(spec.video_id)
            if transcript is None or not transcript.cues:
                # A file the user named that gives no cue is an error, as an unparsable
                # one is: sending "No transcript available." would hide it. Some cues
                # skipped among readable ones: a warning (subtitle-bad-timing).
                why = "; ".join(transcript.problems) if transcript else ""
                raise TranscriptError(
                    spec.transcript,
                    f"the transcript file has no readable cue ({why or 'it holds none'})",
                )
        else:
            transcript, warnings = self._from_provider(spec.video_id, ctx)
        meta = transcript or Transcript(())
        key = f"youtube:{spec.video_id}"
        warnings += tuple(TurnWarning("subtitle-bad-timing", key, p) for p in meta.problems)
        payload = YoutubePayload(
            video_id=spec.video_id,
            title=spec.title or meta.title or f"YouTube video {spec.video_id}",
            channel=spec.channel or meta.channel,
            duration_s=meta.duration_s if spec.duration_s is None else spec.duration_s,
            language=spec.language or meta.language,
            cues=meta.cues,
            has_transcript=bool(meta.cues),
        )
        return Processed(
            (make_artifact("youtube", key, payload, recoverable=True),), warnings=warnings
        )

    def _from_provider(
        self, video_id: str, ctx: ProcessContext
    ) -> tuple[Transcript | None, tuple[TurnWarning, ...]]:
        provider = self.provider or _provider_option(ctx)
        if provider is None:
            return None, ()
        cache_key = f"youtube-transcript:{video_id}"
        if not ctx.refresh and cache_key in ctx.cache:
            cached: Transcript | None = ctx.cache[cache_key]
            return cached, ()
        try:
            transcript = provider.fetch(video_id)
        except TranscriptError as exc:
            message = f"no transcript ({exc})"
            return None, (TurnWarning("transcript-unavailable", f"youtube:{video_id}", message),)
        ctx.cache[cache_key] = transcript
        return transcript, ()


def _provider_option(ctx: ProcessContext) -> TranscriptProvider | None:
    """The ``youtube_provider`` setting: a provider, or "youtube-transcript-api"."""
    settings = read_settings(ctx.options, "youtube", YoutubeSettings)
    option = settings.provider
    if option == "youtube-transcript-api":
        return YoutubeTranscriptApiProvider(settings.languages)
    return option if isinstance(option, TranscriptProvider) else None


def file_provider(path: str, ctx: ProcessContext) -> TranscriptProvider:
    """The provider for a transcript file: vault-relative, or absolute when the host allows."""
    full = resolve_file(path, ctx)
    root = None
    if ctx.vault is not None and not Path(path).is_absolute():
        full, root = full.relative_to(ctx.vault.root), ctx.vault.root
    if full.suffix.lower() == ".json":
        return JsonTranscriptProvider(full, label=path, root=root)
    return SubtitleFileProvider(full, label=path, root=root)


def resolve_file(path: str, ctx: ProcessContext) -> Path:
    """A vault-relative path inside the vault, or an absolute one if the host allows it."""
    if Path(path).is_absolute():
        if not ctx.allow_absolute_paths:
            raise PathOutsideVault(
                path, "absolute paths are not allowed (the host did not enable them)"
            )
        return Path(path)
    if ctx.vault is None:
        raise AttachmentError(path, "a relative path needs a vault")
    return ctx.vault.root / ctx.vault.resolve(path)
