"""Processor settings are typed: a misspelt key is an error naming it and the kind."""

from __future__ import annotations

from pathlib import Path

import pytest

from lamina.pipeline.errors import ConfigError, UnknownSetting
from lamina.processors import (
    PdfSettings,
    ProcessContext,
    Sources,
    UrlProcessor,
    UrlSettings,
    YoutubeSettings,
    read_settings,
    url,
)


def test_settings_are_read_as_the_kinds_typed_class() -> None:
    options = {"url_timeout": 2, "url_max_redirects": 0, "pdf_max_pages": 3}
    assert read_settings(options, "url", UrlSettings) == UrlSettings(timeout=2, max_redirects=0)
    assert read_settings(options, "pdf", PdfSettings) == PdfSettings(max_pages=3)
    assert read_settings({}, "youtube", YoutubeSettings).languages == ("en",)


def test_a_misspelt_setting_names_the_key_and_the_kind() -> None:
    with pytest.raises(UnknownSetting) as info:
        read_settings({"url_timout": 2}, "url", UrlSettings)
    assert (info.value.setting, info.value.kind) == ("url_timout", "url")
    assert str(info.value) == (
        "url_timout: unknown setting: the 'url' processor has no such setting "
        "(known: url_deadline, url_max_bytes, url_max_redirects, url_timeout)"
    )


def test_a_processor_refuses_a_misspelt_setting_of_its_kind() -> None:
    ctx = ProcessContext(options={"url_max_byte": 10})
    with pytest.raises(UnknownSetting, match="url_max_byte: unknown setting: the 'url'"):
        UrlProcessor().process(url("http://127.0.0.1:9/"), ctx)


def test_sources_refuse_a_setting_no_processor_declares(tmp_path: Path) -> None:
    with pytest.raises(UnknownSetting) as info:
        Sources(context=ProcessContext(options={"pdf_max_page": 2}))
    assert (info.value.setting, info.value.kind) == ("pdf_max_page", "pdf")
    with pytest.raises(UnknownSetting) as nobody:
        Sources(context=ProcessContext(options={"timeout": 2}))
    assert nobody.value.kind == ""
    assert "no processor has it" in str(nobody.value)
    assert "url_timeout" in nobody.value.known
    # Settings every processor declares are accepted.
    Sources(context=ProcessContext(options={"pdf_max_pages": 2, "youtube_languages": ["de"]}))


def test_for_vault_refuses_a_misspelt_context_field(tmp_path: Path) -> None:
    with pytest.raises(UnknownSetting, match="allow_private_netwrk: unknown setting"):
        Sources.for_vault(tmp_path, allow_private_netwrk=True)


def test_a_bad_value_is_still_a_config_error_naming_the_option() -> None:
    with pytest.raises(ConfigError, match="url_timeout: must be a positive number"):
        UrlSettings(timeout=0)
    with pytest.raises(ConfigError, match="pdf_max_pages: must be a positive integer"):
        PdfSettings(max_pages=0)
    with pytest.raises(ConfigError, match="youtube_provider: expected a TranscriptProvider"):
        YoutubeSettings(provider="elsewhere")
