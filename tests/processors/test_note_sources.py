"""Notes as written: properties headers, embeds inlined or linked, .MD files."""

from __future__ import annotations

from pathlib import Path

import pytest

from lamina import Conversation
from lamina.pipeline import Form
from lamina.pipeline.errors import ConfigError
from lamina.pipeline.sources import Link, TurnWarning
from lamina.processors import NoteOptions, ProcessContext, Sources, Vault
from lamina.processors._notes import NotePayload, NoteProcessor, folder, note, note_section

VAULT = {
    "spec.md": (
        "---\ntitle: Spec\nstatus: draft\ndue: 2026-12-01\naliases: [S, The Spec]\n"
        "tags: [project]\nowners: {lead: ana, qa: [bo, cy]}\n"
        "publish: true\ncssclasses: [wide]\n---\n"
        "# Spec\nIntro.\n\n![[glossary]]\n\n![[design#Cache rules]]\n\n![[ghost]]\n"
        "![[diagram.png]]\n"
    ),
    "glossary.md": "Terms.\n\n![[terms/deep]]\n",
    "terms/deep.md": "Deep text that embeds back: ![[spec]]\n",
    "design.md": (
        "# Design\nTop.\n\n## Cache rules\nRule one.\n\n### Detail\nSub rule.\n\n"
        "## Other\nNot this. ^blk\n\n![[pic.png]]^img\n"
    ),
    "big.md": "x" * 5000,
    "Upper.MD": "Shouting extension.\n",
}


def make(tmp_path: Path, files: dict[str, str] = VAULT, **options: object) -> ProcessContext:
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return ProcessContext(vault=Vault(tmp_path), notes=NoteOptions(**options))  # type: ignore[arg-type]


def body(processed_artifact: object) -> str:
    payload = processed_artifact.payload
    assert isinstance(payload, NotePayload)
    return payload.body()


def test_properties_head_the_note_compactly(tmp_path: Path) -> None:
    out = NoteProcessor().process(note("spec.md"), make(tmp_path, embeds="links"))
    assert body(out.artifacts[0]).startswith(
        "---\nstatus: draft\ndue: 2026-12-01\naliases: [S, The Spec]\ntags: [project]\n"
        "owners: {lead: ana, qa: [bo, cy]}\n---\n# Spec\nIntro.\n"
    )


def test_all_properties_include_the_display_keys(tmp_path: Path) -> None:
    ctx = make(tmp_path, properties="all")
    text = body(NoteProcessor().process(note("spec.md"), ctx).artifacts[0])
    assert "\npublish: true\ncssclasses: [wide]\n---\n# Spec" in text


def test_properties_can_be_a_list_of_keys_or_none(tmp_path: Path) -> None:
    ctx = make(tmp_path, properties=["tags", "status", "missing"], embeds="links")
    text = body(NoteProcessor().process(note("spec.md"), ctx).artifacts[0])
    assert text.startswith("---\ntags: [project]\nstatus: draft\n---\n# Spec")
    none = make(tmp_path, properties="none", embeds="links")
    assert body(NoteProcessor().process(note("spec.md"), none).artifacts[0]).startswith("# Spec")


def test_bad_note_options_are_config_errors() -> None:
    with pytest.raises(ConfigError):
        NoteOptions(properties="some")
    with pytest.raises(ConfigError):
        NoteOptions(embeds="expand")  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        NoteOptions(embed_depth=-1)
    with pytest.raises(ConfigError, match="'hidden' or 'kept'"):
        NoteOptions(comments="shown")  # type: ignore[arg-type]


def test_a_drawings_json_in_a_comment_never_reaches_the_model(tmp_path: Path) -> None:
    """An Excalidraw note (its text elements, then the drawing's JSON in a ``%%`` comment)
    attached in a budgeted turn sends its text whole and no JSON; with ``comments="kept"``
    the JSON is the note's text and the budget cuts it to a preview."""
    from lamina.pipeline import Budget

    shape = '{"type": "rectangle", "x": -163.85, "y": -186.02, "strokeColor": "#1e1e1e"}'
    drawing = '{"type": "excalidraw", "elements": [\n' + ",\n".join([shape] * 3000) + "\n]}"
    text = (
        "---\nexcalidraw-plugin: parsed\n---\n# Text Elements\nRNG ^IB7q9B4X\n\n"
        f"radio call-in ^GwvKCGYo\n\n%%\n# Drawing\n```json\n{drawing}\n```\n%%\n"
    )
    (tmp_path / "Drawing.excalidraw.md").write_text(text, encoding="utf-8")
    budget = Budget(context_window=8_192, reserve_output=2_048)
    hidden = Conversation("Answer.", sources=Sources.for_vault(tmp_path), budget=budget)
    env = hidden.turn("What does the drawing say?", [note("Drawing.excalidraw.md")])
    (segment,) = env.l3.segments
    assert segment.form is Form.FULL and "radio call-in ^GwvKCGYo" in segment.text
    assert "excalidraw-plugin: parsed" in segment.text and '"type"' not in segment.text
    kept = Conversation(
        "Answer.",
        sources=Sources.for_vault(tmp_path, notes=NoteOptions(comments="kept")),
        budget=budget,
    )
    env = kept.turn("What does the drawing say?", [note("Drawing.excalidraw.md")])
    (segment,) = env.l3.segments
    assert segment.form is Form.PREVIEW and '"type": "excalidraw"' in segment.text


def test_embeds_inline_nested_sections_and_stop_at_a_cycle(tmp_path: Path) -> None:
    out = NoteProcessor().process(note("spec.md"), make(tmp_path))
    assert [a.key for a in out.embedded] == [
        "note:glossary.md",
        "note:terms/deep.md",
        "note:design.md#Cache rules",
    ]
    section = out.embedded[2].payload
    assert isinstance(section, NotePayload)
    assert section.body() == "## Cache rules\nRule one.\n\n### Detail\nSub rule."
    assert section.attributes() == (("path", "design.md"), ("section", "Cache rules"))
    inline = [(k.source, k.target) for k in out.links if k.inline]
    assert inline == [
        ("note:spec.md", "note:glossary.md"),
        ("note:glossary.md", "note:terms/deep.md"),
        ("note:terms/deep.md", "note:spec.md"),  # the cycle: an edge, not a second read
        ("note:spec.md", "note:design.md#Cache rules"),
    ]
    assert out.warnings == (
        TurnWarning("embed-missing", "note:spec.md", "![[ghost]] names no note in the vault"),
    )


def test_embed_depth_and_size_limits(tmp_path: Path) -> None:
    files = {**VAULT, "spec.md": "![[glossary]] ![[big]]"}
    out = NoteProcessor().process(note("spec.md"), make(tmp_path, files, embed_depth=1))
    assert [a.key for a in out.embedded] == ["note:glossary.md"]  # big.md stays a link
    assert [w.code for w in out.warnings] == ["embed-too-deep"]
    assert out.warnings[0].key == "note:glossary.md"


def test_embeds_as_links_policy_adds_nothing(tmp_path: Path) -> None:
    out = NoteProcessor().process(note("spec.md"), make(tmp_path, embeds="links"))
    assert out.embedded == () and not any(k.inline for k in out.links)
    assert Link("note:spec.md", "note:glossary.md", "embeds") in out.links


def test_a_missing_section_is_a_warning(tmp_path: Path) -> None:
    files = {**VAULT, "spec.md": "![[design#Nowhere]] ![[design#^blk]] ![[design#^img]]"}
    out = NoteProcessor().process(note("spec.md"), make(tmp_path, files))
    assert [a.key for a in out.embedded] == ["note:design.md#^blk", "note:design.md#^img"]
    assert out.embedded[0].payload.body() == "## Other\nNot this. ^blk"
    assert out.embedded[1].payload.body() == "![[pic.png]]^img"
    assert [(w.code, w.message) for w in out.warnings] == [
        ("embed-section-missing", "![[design#Nowhere]]: design.md has no such heading or block")
    ]


def test_note_section_ignores_headings_in_code() -> None:
    text = "# A\none\n```\n# B\n```\n## C\ntwo\n# D\nthree"
    assert note_section(text, "A") == "# A\none\n```\n# B\n```\n## C\ntwo"
    assert note_section(text, "B") is None


def test_embedded_notes_follow_their_note_and_dedup_against_the_library(tmp_path: Path) -> None:
    make(tmp_path)
    conv = Conversation(sources=Sources.for_vault(tmp_path))
    first = conv.turn("read", [note("spec.md")])
    keys = [s.key for s in first.l3.segments]
    assert keys == [
        "note:spec.md",
        "note:glossary.md",
        "note:terms/deep.md",
        "note:design.md#Cache rules",
    ]
    assert first.report.stat("embedded") == 3
    assert "Rule one." in first.user_text and "Deep text" in first.user_text
    # Next turn the glossary is in the library: its embed is a reference, not sent again.
    second = conv.turn("again", [note("glossary.md")])
    # (deep.md embeds spec.md back, so the whole chain comes along, all as references.)
    assert [(s.key, s.form) for s in second.l3.segments] == [
        ("note:glossary.md", Form.REFERENCE),
        ("note:terms/deep.md", Form.REFERENCE),
        ("note:spec.md", Form.REFERENCE),
        ("note:design.md#Cache rules", Form.REFERENCE),
    ]


def test_a_folder_places_embeds_once(tmp_path: Path) -> None:
    make(tmp_path)
    conv = Conversation(sources=Sources.for_vault(tmp_path))
    env = conv.turn("all", [folder(".")])
    keys = [s.key for s in env.l3.segments]
    assert len(keys) == len(set(keys))
    # glossary.md pulls in deep.md, which pulls in spec.md and its section embed.
    at = keys.index("note:glossary.md")
    assert keys[at : at + 4] == [
        "note:glossary.md",
        "note:terms/deep.md",
        "note:spec.md",
        "note:design.md#Cache rules",
    ]


def test_notes_with_an_upper_case_extension(tmp_path: Path) -> None:
    ctx = make(tmp_path)
    assert "Upper.MD" in ctx.vault.notes()  # type: ignore[union-attr]
    out = NoteProcessor().process(note("Upper"), ctx)
    assert out.artifacts[0].key == "note:Upper.MD"
    assert NoteProcessor().process(note("Upper.md"), ctx).artifacts[0].key == "note:Upper.MD"
