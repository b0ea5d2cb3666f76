"""A replay's linked conversation report is built under its config's layout and framing,
so its figures are its row's (an append-only config's page used to show the default
layout's: row 15,396 tokens and 72% cached, page 14,628 and 28%)."""

from __future__ import annotations

import re
from pathlib import Path

import lxml.html

from benchmarks.replay_corpus import write_configs, write_replay_corpus
from lamina._config import load_config
from lamina._corpus import find_corpus
from lamina._replay import replay_recording
from lamina._replay_report import conversation_page


def _cards(html: str) -> dict[str, str]:
    doc = lxml.html.document_fromstring(html)
    return {
        card.xpath("./span")[0].text_content(): card.xpath("./b")[0].text_content()
        for card in doc.xpath("//div[@class='card']")
    }


def test_linked_report_agrees_with_its_row(tmp_path: Path) -> None:
    chats = write_replay_corpus(tmp_path / "corpus", 2, seed=7)
    configs = [load_config(p) for p in write_configs(tmp_path / "configs")]
    tight = next(c for c in configs if c.name == "tight")
    assert tight.layout == "append-only"
    recording = find_corpus([chats]).recordings[0]
    (row,) = replay_recording(recording, [tight])
    assert row.ok and row.turns > 1
    page = conversation_page(recording, tight)
    assert page is not None
    html, turns = page
    assert turns == row.turns
    cards = _cards(html)
    assert int(cards["tokens sent (all turns)"].replace(",", "")) == row.tokens_sent
    # The page's cached prefix is before the provider's rules (minimum, 128-token steps):
    # at least what the provider is simulated to serve, in the same unit.
    openai = row.provider("openai")
    assert openai is not None and openai.input_tokens == row.tokens_sent
    repeated = int(cards["of them a repeated prefix"].replace(",", ""))
    assert openai.cached_tokens <= repeated <= row.tokens_sent
    assert repeated - openai.cached_tokens <= 128 * row.turns + 1024
    assert re.search(r"requests in the append-only layout", html)
