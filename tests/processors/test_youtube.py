"""YouTube attachments: video ids, transcript files and providers, and the rendered body."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from lamina.pipeline.errors import AttachmentError, PathOutsideVault, TranscriptError
from lamina.processors._context import ProcessContext
from lamina.processors._vault import Vault
from lamina.processors._youtube import (
    NO_TRANSCRIPT,
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

VID = "dQw4w9WgXcQ"

GOOD_URLS = [
    VID,
    f"  {VID}\n",
    f"https://www.youtube.com/watch?v={VID}",
    f"http://youtube.com/watch?v={VID}",
    f"youtube.com/watch?v={VID}",
    f"www.youtube.com/watch?v={VID}",
    f"https://m.youtube.com/watch?v={VID}",
    f"https://music.youtube.com/watch?v={VID}&list=RDAMVM{VID}",
    f"https://www.youtube.com/watch?v={VID}&t=42s",
    f"https://www.youtube.com/watch?feature=share&v={VID}&si=abc123",
    f"https://www.youtube.com/watch?v={VID}&list=PL590L5WQmH8fJ54F369BLDSqIwcs-TCfs&index=3",
    f"https://WWW.YouTube.COM/watch?v={VID}#comments",
    f"https://youtu.be/{VID}",
    f"https://youtu.be/{VID}?t=30",
    f"https://youtu.be/{VID}?si=Xyz_-123",
    f"youtu.be/{VID}",
    f"https://www.youtube.com/shorts/{VID}",
    f"https://youtube.com/shorts/{VID}?feature=share",
    f"https://www.youtube.com/embed/{VID}",
    f"https://www.youtube.com/embed/{VID}?start=10&autoplay=1",
    f"https://www.youtube-nocookie.com/embed/{VID}",
    f"https://www.youtube.com/live/{VID}",
    f"https://www.youtube.com/live/{VID}?si=live1",
    f"https://www.youtube.com/v/{VID}",
    f"https://www.youtube.com:443/watch?v={VID}",
    f"https://m.youtube.com/shorts/{VID}/",
]

BAD_URLS = [
    "",
    "   ",
    "dQw4w9WgXc",  # 10 characters
    "dQw4w9WgXcQQ",  # 12 characters
    "dQw4w9WgXc!",
    "https://www.youtube.com/",
    "https://www.youtube.com/watch",
    "https://www.youtube.com/watch?v=",
    "https://www.youtube.com/watch?v=short",
    "https://www.youtube.com/watch?list=PL590L5WQmH8fJ54F369BLDSqIwcs-TCfs",
    "https://www.youtube.com/playlist?list=PL590L5WQmH8fJ54F369BLDSqIwcs-TCfs",
    "https://www.youtube.com/@SomeChannel",
    "https://www.youtube.com/channel/UC38IQsAvIsxxjztdMZQtwHA",
    "https://www.youtube.com/embed/videoseries?list=PL590L5WQmH8fJ",
    f"https://www.youtube.com/shorts/{VID}/extra",
    f"https://vimeo.com/{VID}",
    f"https://notyoutube.com/watch?v={VID}",
    f"https://youtube.com.evil.example/watch?v={VID}",
    f"https://youtu.be/{VID}/more",
    f"ftp://youtube.com/watch?v={VID}",
    f"https://youtube-nocookie.com/watch?v={VID}",
    "not a url at all",
]


@pytest.mark.parametrize("url", GOOD_URLS)
def test_every_common_url_form_gives_the_video_id(url: str) -> None:
    assert parse_video_id(url) == VID


@pytest.mark.parametrize("url", BAD_URLS)
def test_anything_else_is_refused_naming_the_input(url: str) -> None:
    with pytest.raises(TranscriptError) as info:
        parse_video_id(url)
    assert info.value.video == url


def test_a_non_string_reference_is_refused() -> None:
    with pytest.raises(TranscriptError):
        parse_video_id(12345678901)  # type: ignore[arg-type]


@pytest.fixture
def vault_dir(tmp_path: Path) -> Path:
    root = tmp_path / "vault"
    (root / "media").mkdir(parents=True)
    return root


@pytest.fixture
def ctx(vault_dir: Path) -> ProcessContext:
    return ProcessContext(vault=Vault(vault_dir))


def payload_of(spec_url: str, ctx: ProcessContext, **kwargs: object) -> YoutubePayload:
    processed = YoutubeProcessor().process(youtube(spec_url, **kwargs), ctx)  # type: ignore[arg-type]
    (artifact,) = processed.artifacts
    assert isinstance(artifact.payload, YoutubePayload)
    return artifact.payload


ROLLING_VTT = (
    "\ufeffWEBVTT\n"
    "Kind: captions\n"
    "Language: en\n"
    "\n"
    "00:00:00.000 --> 00:00:02.500 align:start position:0%\n"
    "hello<00:00:00.500><c> world</c><00:00:01.000><c> this</c>\n"
    "\n"
    "00:00:02.500 --> 00:00:02.510 align:start position:0%\n"
    "hello world this\n"
    "\n"
    "00:00:02.510 --> 00:00:05.000 align:start position:0%\n"
    "hello world this\n"
    "is<00:00:03.000><c> a</c><00:00:03.500><c.colorE5E5E5> test</c>\n"
    "\n"
    "00:00:05.000 --> 00:00:05.010 align:start position:0%\n"
    "is a test\n"
    "\n"
    "00:00:05.010 --> 00:00:07.000 align:start position:0%\n"
    "is a test\n"
    "of <i>styled</i> <b>captions</b> &amp; <v Roger>voices</v>\n"
)


def test_vtt_rolling_auto_captions_are_merged_and_cleaned(vault_dir: Path) -> None:
    path = vault_dir / "media" / "auto.vtt"
    path.write_text(ROLLING_VTT, encoding="utf-8")
    transcript = SubtitleFileProvider(path).fetch(VID)
    assert transcript == Transcript(
        (
            Cue(0, 2510, "hello world this"),
            Cue(2510, 5010, "is a test"),
            Cue(5010, 7000, "of styled captions & voices"),
        ),
        language="en",
    )


def test_vtt_header_metadata_reaches_the_payload(vault_dir: Path, ctx: ProcessContext) -> None:
    (vault_dir / "media" / "talk.vtt").write_text(
        "WEBVTT\nLanguage: de\nTitle: Ein Vortrag\nChannel: Kanal\n\n"
        "00:00:00.000 --> 00:00:01.000\nHallo.\n",
        encoding="utf-8",
    )
    payload = payload_of(VID, ctx, transcript="media/talk.vtt")
    assert (payload.language, payload.title, payload.channel) == ("de", "Ein Vortrag", "Kanal")


def test_vtt_overlapping_cues_drop_repeated_words(vault_dir: Path) -> None:
    path = vault_dir / "media" / "overlap.vtt"
    path.write_text(
        "WEBVTT\n\n"
        "00:00:01.000 --> 00:00:04.000\nthe quick brown fox\n\n"
        "00:00:03.000 --> 00:00:06.000\nbrown fox jumps over\n\n"
        "00:00:06.000 --> 00:00:08.000\njumps over\n\n"
        "00:00:08.000 --> 00:00:09.000\nthe lazy dog.\n",
        encoding="utf-8",
    )
    cues = SubtitleFileProvider(path).fetch(VID)
    assert cues is not None
    assert cues.cues == (
        Cue(1000, 4000, "the quick brown fox"),
        Cue(3000, 8000, "jumps over"),
        Cue(8000, 9000, "the lazy dog."),
    )


SRT = (
    "\ufeff1\r\n"
    "00:00:00,000 --> 00:00:02,000\r\n"
    "{\\an8}<i>Welcome</i> to the\r\n"
    '<font color="#ffffff">show</font>\r\n'
    "\r\n"
    "2\r\n"
    "00:00:01,500 --> 00:00:04,000\r\n"
    "to the show tonight\r\n"
    "\r\n"
    "3\r\n"
    "00:00:04,000 --> 00:00:05,000\r\n"
    "to the show tonight\r\n"
    "\r\n"
    "4\r\n"
    "00:00:09,000 --> 00:00:10,000\r\n"
    "Goodbye\u200b.\r\n"
)


def test_srt_with_bom_tags_and_overlaps(vault_dir: Path) -> None:
    path = vault_dir / "media" / "show.srt"
    path.write_bytes(SRT.encode("utf-8"))
    transcript = SubtitleFileProvider(path).fetch(VID)
    assert transcript is not None
    assert transcript.cues == (
        Cue(0, 2000, "Welcome to the show"),
        Cue(1500, 5000, "tonight"),
        Cue(9000, 10000, "Goodbye."),
    )


def test_identical_text_far_apart_is_kept(vault_dir: Path) -> None:
    path = vault_dir / "media" / "chorus.srt"
    path.write_text(
        "1\n00:00:00,000 --> 00:00:02,000\nla la la\n\n"
        "2\n00:00:30,000 --> 00:00:32,000\nla la la\n",
        encoding="utf-8",
    )
    transcript = SubtitleFileProvider(path).fetch(VID)
    assert transcript is not None
    assert [c.text for c in transcript.cues] == ["la la la", "la la la"]


def test_json_list_transcript(vault_dir: Path) -> None:
    path = vault_dir / "media" / "t.json"
    path.write_text(
        json.dumps(
            [
                {"start": 0.0, "duration": 1.5, "text": "First  line"},
                {"start": 1.5, "end": 3.25, "text": "second\nline"},
            ]
        ),
        encoding="utf-8",
    )
    transcript = JsonTranscriptProvider(path).fetch(VID)
    assert transcript == Transcript((Cue(0, 1500, "First line"), Cue(1500, 3250, "second line")))


def test_json_header_metadata_reaches_the_payload(vault_dir: Path, ctx: ProcessContext) -> None:
    (vault_dir / "media" / "talk.json").write_text(
        json.dumps(
            {
                "title": "A Talk",
                "channel": "Conf Channel",
                "language": "en",
                "duration": "1:02:03",
                "cues": [{"start": 2, "duration": 2, "text": "Hello."}],
            }
        ),
        encoding="utf-8",
    )
    payload = payload_of(VID, ctx, transcript="media/talk.json")
    assert (payload.title, payload.channel, payload.language) == ("A Talk", "Conf Channel", "en")
    assert payload.duration_s == 3723
    assert payload.attributes() == (
        ("url", f"https://www.youtube.com/watch?v={VID}"),
        ("channel", "Conf Channel"),
        ("duration", "1:02:03"),
    )


def test_spec_metadata_overrides_the_transcript_header(
    vault_dir: Path, ctx: ProcessContext
) -> None:
    (vault_dir / "media" / "talk.json").write_text(
        json.dumps({"title": "Header Title", "cues": [{"start": 0, "text": "Hi."}]}),
        encoding="utf-8",
    )
    payload = payload_of(VID, ctx, transcript="media/talk.json", title="Given Title", duration=90)
    assert payload.title == "Given Title"
    assert payload.attributes()[-1] == ("duration", "01:30")


@pytest.mark.parametrize(
    "content",
    ['{"cues": "nope"}', '[{"text": "no start"}]', '[{"start": 1, "text": 5}]', "{not json"],
)
def test_malformed_json_transcripts_are_transcript_errors(
    vault_dir: Path, ctx: ProcessContext, content: str
) -> None:
    (vault_dir / "media" / "bad.json").write_text(content, encoding="utf-8")
    with pytest.raises(TranscriptError) as info:
        payload_of(VID, ctx, transcript="media/bad.json")
    assert info.value.video == "media/bad.json"


def test_malformed_vtt_is_a_transcript_error(vault_dir: Path, ctx: ProcessContext) -> None:
    (vault_dir / "media" / "bad.vtt").write_text("this is not webvtt\n", encoding="utf-8")
    with pytest.raises(TranscriptError):
        payload_of(VID, ctx, transcript="media/bad.vtt")


def test_missing_transcript_file_is_a_transcript_error(ctx: ProcessContext) -> None:
    with pytest.raises(TranscriptError, match="not found"):
        payload_of(VID, ctx, transcript="media/none.vtt")


def test_transcript_outside_the_vault_is_refused(tmp_path: Path, ctx: ProcessContext) -> None:
    (tmp_path / "outside.vtt").write_text("WEBVTT\n", encoding="utf-8")
    with pytest.raises(PathOutsideVault):
        payload_of(VID, ctx, transcript="../outside.vtt")
    with pytest.raises(PathOutsideVault):
        payload_of(VID, ctx, transcript=str(tmp_path / "outside.vtt"))


def test_absolute_transcript_path_when_the_host_allows(tmp_path: Path, vault_dir: Path) -> None:
    outside = tmp_path / "outside.vtt"
    outside.write_text("WEBVTT\n\n00:00:00.000 --> 00:00:01.000\nHi there.\n", encoding="utf-8")
    ctx = ProcessContext(vault=Vault(vault_dir), allow_absolute_paths=True)
    assert payload_of(VID, ctx, transcript=str(outside)).cues == (Cue(0, 1000, "Hi there."),)


def test_no_transcript_gives_an_explicit_artifact(ctx: ProcessContext) -> None:
    processed = YoutubeProcessor().process(youtube(f"https://youtu.be/{VID}"), ctx)
    (artifact,) = processed.artifacts
    assert artifact.key == f"youtube:{VID}"
    assert artifact.recoverable
    assert artifact.title == f"YouTube video {VID}"
    assert artifact.payload.body() == NO_TRANSCRIPT == "No transcript available."
    assert isinstance(artifact.payload, YoutubePayload)
    assert not artifact.payload.has_transcript
    assert artifact.payload.attributes() == (("url", f"https://www.youtube.com/watch?v={VID}"),)


class FakeProvider:
    def __init__(self, result: Transcript | Exception | None) -> None:
        self.result = result
        self.calls = 0

    def fetch(self, video_id: str) -> Transcript | None:
        self.calls += 1
        if isinstance(self.result, Exception):
            raise self.result
        return self.result


def test_fake_provider_satisfies_the_protocol() -> None:
    assert isinstance(FakeProvider(None), TranscriptProvider)
    assert isinstance(YoutubeTranscriptApiProvider(), TranscriptProvider)


def test_provider_without_a_transcript_gives_the_explicit_artifact(ctx: ProcessContext) -> None:
    processed = YoutubeProcessor(FakeProvider(None)).process(youtube(VID), ctx)
    assert processed.artifacts[0].payload.body() == NO_TRANSCRIPT
    assert processed.warnings == ()


def test_provider_failure_is_a_warning_not_an_exception(ctx: ProcessContext) -> None:
    failing = FakeProvider(TranscriptError(VID, "could not fetch the transcript: ConnectError"))
    processed = YoutubeProcessor(failing).process(youtube(VID), ctx)
    assert processed.artifacts[0].payload.body() == NO_TRANSCRIPT
    assert len(processed.warnings) == 1 and "ConnectError" in processed.warnings[0].message
    assert processed.warnings[0].code == "transcript-unavailable"


def test_provider_results_are_cached_per_conversation_until_refresh(vault_dir: Path) -> None:
    provider = FakeProvider(Transcript((Cue(0, 1000, "Cached."),), language="en"))
    ctx = ProcessContext(vault=Vault(vault_dir))
    processor = YoutubeProcessor(provider)
    first = processor.process(youtube(VID), ctx).artifacts[0]
    second = processor.process(youtube(VID), ctx).artifacts[0]
    assert first == second and provider.calls == 1
    processor.process(youtube(VID), ProcessContext(vault=ctx.vault, refresh=True, cache=ctx.cache))
    assert provider.calls == 2


def test_provider_can_come_from_context_options(ctx: ProcessContext) -> None:
    provider = FakeProvider(Transcript((Cue(0, 1000, "From options."),)))
    options_ctx = ProcessContext(vault=ctx.vault, options={"youtube_provider": provider})
    payload = YoutubeProcessor().process(youtube(VID), options_ctx).artifacts[0].payload
    assert payload.body() == "[00:00] From options."


def test_network_provider_without_the_library_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "youtube_transcript_api", None)
    with pytest.raises(TranscriptError, match=r"lamina\[youtube\]"):
        YoutubeTranscriptApiProvider().fetch(VID)


def test_body_groups_cues_into_paragraphs_with_markers() -> None:
    payload = YoutubePayload(
        video_id=VID,
        title="t",
        channel="",
        duration_s=None,
        language="",
        cues=(
            Cue(0, 4000, "Welcome to the talk."),
            Cue(4000, 9000, "Today we cover caching"),
            Cue(9000, 31000, "and prefixes."),
            Cue(31000, 35000, "Next, budgets."),
            Cue(40000, 42000, "After a pause."),
        ),
        has_transcript=True,
    )
    assert payload.body() == (
        "[00:00] Welcome to the talk. Today we cover caching and prefixes.\n\n"
        "[00:31] Next, budgets.\n\n"
        "[00:40] After a pause."
    )


def test_long_transcripts_get_a_heading_every_five_minutes() -> None:
    cues = tuple(Cue(m * 60_000, m * 60_000 + 5000, f"Minute {m}.") for m in (0, 4, 6, 61))
    payload = YoutubePayload(VID, "t", "", None, "", cues, True)
    assert payload.body() == (
        "## [00:00]\n\n[00:00] Minute 0.\n\n[04:00] Minute 4.\n\n"
        "## [05:00]\n\n[06:00] Minute 6.\n\n"
        "## [1:00:00]\n\n[1:01:00] Minute 61."
    )


def test_transcript_file_end_to_end(vault_dir: Path, ctx: ProcessContext) -> None:
    (vault_dir / "media" / "auto.vtt").write_text(ROLLING_VTT, encoding="utf-8")
    spec = YoutubeProcessor().parse(
        {"youtube": f"https://youtu.be/{VID}", "transcript": "media/auto.vtt", "channel": "Chan"}
    )
    (artifact,) = YoutubeProcessor().process(spec, ctx).artifacts
    assert artifact.key == f"youtube:{VID}"
    assert (
        artifact.payload.body() == "[00:00] hello world this is a test of styled captions & voices"
    )
    assert isinstance(artifact.payload, YoutubePayload)
    assert artifact.payload.language == "en"
    assert artifact.payload.has_transcript


def test_script_form_refuses_unknown_fields_and_bad_urls() -> None:
    with pytest.raises(AttachmentError):
        YoutubeProcessor().parse({"youtube": VID, "subtitles": "a.vtt"})
    with pytest.raises(TranscriptError):
        YoutubeProcessor().parse({"youtube": "https://vimeo.com/123"})
    with pytest.raises(TranscriptError):
        YoutubeProcessor().parse({"youtube": VID, "duration": "soon"})


def test_spec_describes_itself() -> None:
    spec = youtube(f"https://www.youtube.com/watch?v={VID}&t=1")
    assert (spec.kind, spec.describe()) == ("youtube", f"youtube {VID}")


def test_same_transcript_gives_the_same_hash(vault_dir: Path, ctx: ProcessContext) -> None:
    (vault_dir / "media" / "auto.vtt").write_text(ROLLING_VTT, encoding="utf-8")
    first = payload_of(VID, ctx, transcript="media/auto.vtt")
    again = YoutubeProcessor().process(youtube(VID, "media/auto.vtt"), ctx).artifacts[0]
    assert again.payload == first
    assert again == YoutubeProcessor().process(youtube(VID, "media/auto.vtt"), ctx).artifacts[0]


def test_replace_text_maps_title_channel_and_cues() -> None:
    payload = YoutubePayload(VID, "Title", "Chan", None, "en", (Cue(0, 1, "secret"),), True)
    mapped = payload.replace_text(str.upper)
    assert (mapped.title, mapped.channel, mapped.cues) == ("TITLE", "CHAN", (Cue(0, 1, "SECRET"),))


NO_CUE = {
    "only-cue-broken.vtt": (
        "WEBVTT\n\n00:00:01.000 -> 00:00:02.000\nHello\n",
        "no readable cue (1 cue was skipped: unreadable timing line (line 3 of the file))",
    ),
    "header-only.vtt": ("WEBVTT\n", "no readable cue (it holds none)"),
    "empty-text.vtt": ("WEBVTT\n\n00:00:01.000 --> 00:00:02.000\n\n", "no readable cue"),
    "no-cues.json": ("[]", "no readable cue (it holds none)"),
}


@pytest.mark.parametrize("name", sorted(NO_CUE))
def test_a_transcript_file_with_no_readable_cue_is_an_error(
    vault_dir: Path, ctx: ProcessContext, name: str
) -> None:
    """Decided: a file the user named that yields no cue is a TranscriptError, as an
    unparsable one is; before, the video went out as "No transcript available." (with a
    warning when its only cue was broken, silently when it had none)."""
    text, problem = NO_CUE[name]
    (vault_dir / name).write_text(text, encoding="utf-8")
    expected = re.escape(f"{name}: the transcript file has {problem}")
    with pytest.raises(TranscriptError, match=expected):
        payload_of(VID, ctx, transcript=name)


def test_a_transcript_with_some_cues_broken_is_sent_with_a_warning(
    vault_dir: Path, ctx: ProcessContext
) -> None:
    (vault_dir / "some.vtt").write_text(
        "WEBVTT\n\n00:00:01.000 -> 00:00:02.000\nLost\n\n00:00:03.000 --> 00:00:04.000\nKept\n",
        encoding="utf-8",
    )
    processed = YoutubeProcessor().process(youtube(VID, "some.vtt"), ctx)
    assert processed.artifacts[0].payload.cues == (Cue(3000, 4000, "Kept"),)  # type: ignore[attr-defined]
    assert [w.code for w in processed.warnings] == ["subtitle-bad-timing"]
