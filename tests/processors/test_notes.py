"""Note parsing and the note / folder / tag processors."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import pytest

from lamina.pipeline._errors import AttachmentError, NoteNotFound, PathOutsideVault
from lamina.pipeline._model.artifacts import Link, Processed
from lamina.processors._context import ProcessContext
from lamina.processors._notes import (
    FolderProcessor,
    NotePayload,
    NoteProcessor,
    TagProcessor,
    WikiLink,
    folder,
    note,
    parse_note,
    tag,
)
from lamina.processors._vault import Vault

EXAMPLE_VAULT = Path(__file__).resolve().parents[2] / "examples" / "vault"


def make_ctx(root: Path, files: dict[str, str | bytes]) -> ProcessContext:
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")
    return ProcessContext(vault=Vault(root))


def parsed(
    text: str, path: str = "n.md", *, comments: Literal["hidden", "kept"] = "hidden"
) -> NotePayload:
    return parse_note(path, text, comments=comments)[0]


# --- frontmatter and title ------------------------------------------------------------


def test_no_frontmatter_title_is_the_file_stem() -> None:
    payload = parsed("# Heading\nbody", path="docs/my note.md")
    assert payload.title == "my note"
    assert payload.body() == "# Heading\nbody"
    assert payload.tags == ()


def test_frontmatter_title_tags_list_and_aliases() -> None:
    payload = parsed("---\ntitle: Spec\ntags: [B, '#a/x']\naliases: [S1, S2]\n---\n\nBody\n")
    assert payload.title == "Spec"
    assert payload.tags == ("a/x", "b")
    assert payload.aliases == ("S1", "S2")
    assert payload.body_text == "Body\n"
    # The frontmatter (title aside: it is the block's title) heads the body as properties.
    assert payload.body() == '---\ntags: [B, "#a/x"]\naliases: [S1, S2]\n---\nBody\n'
    # Made once per version: every later call hands out the same string, not a new copy.
    assert payload.body() is payload.body()
    edited = parsed("---\ntags: [B]\n---\n\nBody, edited\n")
    assert edited.body() == "---\ntags: [B]\n---\nBody, edited\n"


@pytest.mark.parametrize("tags", ["alpha, beta", "alpha beta", "'#alpha #beta'"])
def test_frontmatter_tags_as_a_string(tags: str) -> None:
    assert parsed(f"---\ntags: {tags}\n---\nx").tags == ("alpha", "beta")


def test_malformed_frontmatter_is_a_warning_and_stays_in_the_body() -> None:
    text = "---\ntitle: [unclosed\n---\nbody #inline"
    payload, warnings = parse_note("bad.md", text)
    assert payload.title == "bad"
    assert payload.body() == text
    assert payload.tags == ("inline",)
    assert len(warnings) == 1
    assert warnings[0].key == "note:bad.md" and warnings[0].code == "frontmatter-malformed"
    assert warnings[0].message == "malformed YAML frontmatter at line 2; read as body"


def test_unclosed_frontmatter_is_a_warning() -> None:
    payload, warnings = parse_note("u.md", "---\ntitle: X\nno end")
    assert payload.title == "u"
    assert warnings and "not closed" in warnings[0].message


def test_non_mapping_frontmatter_is_a_warning() -> None:
    payload, warnings = parse_note("l.md", "---\n- a\n- b\n---\nbody")
    assert payload.title == "l"
    assert warnings and "not a mapping" in warnings[0].message


def test_empty_frontmatter_is_dropped_silently() -> None:
    payload, warnings = parse_note("e.md", "---\n---\nbody")
    assert (payload.body(), warnings) == ("body", ())


# --- wikilinks and inline tags ----------------------------------------------------------


def test_wikilinks_embeds_aliases_and_subpaths_in_order() -> None:
    payload = parsed(
        "See [[a]] and [[docs/b|Bee]], ![[c.png]] then [[d#Setup|the setup]] [[e#^blk]]"
    )
    assert payload.links == (
        WikiLink("a", None, False, None),
        WikiLink("docs/b", "Bee", False, None),
        WikiLink("c.png", None, True, None),
        WikiLink("d", "the setup", False, "Setup"),
        WikiLink("e", None, False, "^blk"),
    )


def test_inline_tags_skip_code_headings_numbers_and_urls() -> None:
    body = "\n".join(
        [
            "# Heading",
            "## Second #real",
            "text #one and #Two/Sub, not #123 nor a#b",
            "see https://x.example/page#frag and [l](#anchor)",
            "`#inline-code` and [[note#heading]]",
            "```",
            "#in-fence [[not-a-link]]",
            "```",
            "~~~~",
            "#tilde",
            "~~~~",
            "#after",
            "```not a fence``` #fine",
        ]
    )
    payload = parsed(body)
    assert payload.tags == ("after", "fine", "one", "real", "two/sub")
    assert [link.target for link in payload.links] == ["note"]


def test_comments_are_hidden_as_in_obsidians_reading_view() -> None:
    """``%%`` comments go (within a line, over lines, never closed: to the end), the lines a
    block comment fills with them; ``%%`` in code is text."""
    text = (
        "An %%inline%% comment.\n"
        "%%\nA block comment.\n%%\n"
        "Kept `%%code%%` and\n```\n%% fenced %%\n```\n"
        "Last %%never closed\nline"
    )
    assert parsed(text).body_text == (
        "An  comment.\nKept `%%code%%` and\n```\n%% fenced %%\n```\nLast "
    )
    assert parsed(text, comments="kept").body_text == text


@pytest.mark.timeout(30)
def test_a_note_of_many_comments_and_code_spans_is_read_in_one_pass() -> None:
    """80,000 comments beside as many code spans on one line (about 1 MB): each ``%%`` is
    placed among the code spans by a search, and a comment's line start is not looked for
    from the line's start, so the note is read in one pass (the first version looked at
    every span for every ``%%``, and back to the line's start for every comment: about four
    minutes for this note)."""
    assert parsed("`a` %%x%% " * 80_000).body_text == "`a`  " * 80_000


def test_a_comments_tags_tag_the_note_and_its_links_are_not_read() -> None:
    """A tag in a comment is a hidden tag (Obsidian indexes it); a link there is not shown,
    so it is no edge and an embed there is not inlined."""
    note_ = parsed("See [[A]]. %% #trait/hidden [[B]] ![[C]] %% #shown")
    assert note_.tags == ("shown", "trait/hidden")
    assert [link.target for link in note_.links] == ["A"]


def test_an_excalidraw_drawing_reaches_the_model_as_its_text_elements() -> None:
    """The plugin keeps the drawing's JSON in a comment: it is not the note's text."""
    drawing = '{"type": "excalidraw", "elements": [' + '{"x": 1.5, "y": 2.5},' * 2000 + "]}"
    text = (
        "---\nexcalidraw-plugin: parsed\ntags: [excalidraw]\n---\n"
        "# Text Elements\nRNG ^IB7q9B4X\n\nradio call-in ^GwvKCGYo\n\n"
        f"%%\n# Drawing\n```json\n{drawing}\n```\n%%"
    )
    note_ = parsed(text, "Drawing.excalidraw.md")
    assert note_.body_text == "# Text Elements\nRNG ^IB7q9B4X\n\nradio call-in ^GwvKCGYo\n\n"
    assert note_.tags == ("excalidraw",)


def test_has_tag_matches_nested_but_not_prefix_words() -> None:
    payload = parsed("#a/b")
    assert payload.has_tag("#a")
    assert payload.has_tag("#A/B")
    assert not payload.has_tag("#a/b/c")
    assert not parsed("#ab").has_tag("#a")


def test_replace_text_maps_the_body_only() -> None:
    payload = parsed("---\ntitle: T\n---\nmail me@x.org")
    redacted = payload.replace_text(lambda s: s.replace("me@x.org", "[email]"))
    assert redacted.body() == "mail [email]"
    assert (redacted.title, redacted.path) == ("T", "n.md")


# --- note processor ---------------------------------------------------------------------


def test_note_artifact_key_attributes_and_recoverable(tmp_path: Path) -> None:
    ctx = make_ctx(tmp_path, {"docs/a.md": "hello"})
    out = NoteProcessor().process(note("docs/a"), ctx)
    (art,) = out.artifacts
    assert art.key == "note:docs/a.md"
    assert art.source_type == "note"
    assert art.recoverable is True
    assert art.payload.attributes() == (("path", "docs/a.md"),)
    assert art.locator == "docs/a.md"


def test_note_links_resolve_obsidian_style(tmp_path: Path) -> None:
    ctx = make_ctx(
        tmp_path,
        {
            "src.md": "[[b]] [[x/c|C]] ![[deep]] [[ghost]] [[Target]] [[#self]]",
            "b.md": "",
            "x/c.md": "",
            "z/deep.md": "",
            "a/y/deep.md": "",
            "k/target.md": "",
        },
    )
    out = NoteProcessor().process(note("src.md"), ctx)
    assert out.links == (
        Link("note:src.md", "note:b.md", "links"),
        Link("note:src.md", "note:x/c.md", "links"),
        # A small note's embed is inlined, and its edge says so.
        Link("note:src.md", "note:z/deep.md", "embeds", inline=True),
        Link("note:src.md", "unresolved:ghost", "links"),
        Link("note:src.md", "note:k/target.md", "links"),
    )


def test_note_links_prefer_the_source_folder_for_relative_paths(tmp_path: Path) -> None:
    ctx = make_ctx(tmp_path, {"docs/src.md": "[[./api]]", "docs/api.md": "", "api.md": ""})
    out = NoteProcessor().process(note("docs/src.md"), ctx)
    assert out.links == (Link("note:docs/src.md", "note:docs/api.md", "links"),)


def test_note_without_vault_is_an_error() -> None:
    with pytest.raises(AttachmentError, match="vault is required"):
        NoteProcessor().process(note("a.md"), ProcessContext())


def test_missing_note_raises_with_suggestions(tmp_path: Path) -> None:
    ctx = make_ctx(tmp_path, {"project-spec.md": ""})
    with pytest.raises(NoteNotFound) as info:
        NoteProcessor().process(note("project-spek.md"), ctx)
    assert info.value.suggestions == ("project-spec.md",)


def test_note_outside_vault_is_refused(tmp_path: Path) -> None:
    ctx = make_ctx(tmp_path / "v", {"a.md": ""})
    (tmp_path / "secret.md").write_text("s", encoding="utf-8")
    with pytest.raises(PathOutsideVault):
        NoteProcessor().process(note("../secret.md"), ctx)


def test_non_utf8_note_is_read_with_a_warning(tmp_path: Path) -> None:
    ctx = make_ctx(tmp_path, {"bad.md": b"ok \xff\xfe end"})
    out = NoteProcessor().process(note("bad.md"), ctx)
    assert "\ufffd" in out.artifacts[0].payload.body()
    assert len(out.warnings) == 1 and out.warnings[0].key == "note:bad.md"


def test_overlay_changes_content_hash_but_not_disk(tmp_path: Path) -> None:
    ctx = make_ctx(tmp_path, {"a.md": "v1"})
    assert ctx.vault is not None
    before = NoteProcessor().process(note("a.md"), ctx).artifacts[0]
    changed = ProcessContext(vault=ctx.vault.with_changes({"a.md": "v2"}))
    after = NoteProcessor().process(note("a.md"), changed).artifacts[0]
    assert after.payload.body() == "v2"
    assert after.key == before.key
    assert after.content_hash != before.content_hash
    assert (tmp_path / "a.md").read_text(encoding="utf-8") == "v1"


def test_identical_content_gives_identical_hash_across_vaults(tmp_path: Path) -> None:
    text = "---\ntags: [x]\n---\n# T\n[[other]] #y\n"
    one = make_ctx(tmp_path / "one", {"n.md": text})
    two = make_ctx(tmp_path / "two", {"n.md": text})
    a = NoteProcessor().process(note("n.md"), one).artifacts[0]
    b = NoteProcessor().process(note("n.md"), two).artifacts[0]
    assert a.content_hash == b.content_hash
    assert a == b


# --- folder and tag -----------------------------------------------------------------------


def test_folder_lists_notes_below_it_sorted_with_contains_edges(tmp_path: Path) -> None:
    ctx = make_ctx(
        tmp_path, {"d/z.md": "", "d/a.md": "", "d/sub/m.md": "", "dd/no.md": "", "top.md": ""}
    )
    out = FolderProcessor().process(folder("d/"), ctx)
    assert [a.key for a in out.artifacts] == ["note:d/a.md", "note:d/sub/m.md", "note:d/z.md"]
    assert out.group == "folder:d"
    assert out.links[:3] == tuple(Link("folder:d", a.key, "contains") for a in out.artifacts)


def test_missing_folder_names_it_and_suggests(tmp_path: Path) -> None:
    ctx = make_ctx(tmp_path, {"meetings/a.md": ""})
    with pytest.raises(AttachmentError, match=r"meeting: no such folder.*meetings"):
        FolderProcessor().process(folder("meeting"), ctx)


def test_empty_folder_is_an_error(tmp_path: Path) -> None:
    ctx = make_ctx(tmp_path, {"a.md": ""})
    (tmp_path / "empty").mkdir()
    with pytest.raises(AttachmentError, match="empty: the folder holds no notes"):
        FolderProcessor().process(folder("empty"), ctx)


def test_tag_matches_frontmatter_inline_and_nested_case_insensitively(tmp_path: Path) -> None:
    ctx = make_ctx(
        tmp_path,
        {
            "fm.md": "---\ntags: [Project]\n---\n",
            "inline.md": "text #project/Lamina",
            "prefix.md": "#projects",
            "fenced.md": "```\n#project\n```",
        },
    )
    out = TagProcessor().process(tag("#PROJECT"), ctx)
    assert [a.key for a in out.artifacts] == ["note:fm.md", "note:inline.md"]
    assert out.group == "tag:#project"
    assert Link("tag:#project", "note:fm.md", "contains") in out.links


def test_unmatched_tag_is_an_error_naming_it(tmp_path: Path) -> None:
    ctx = make_ctx(tmp_path, {"a.md": "#other"})
    with pytest.raises(AttachmentError, match="#nothing"):
        TagProcessor().process(tag("#nothing"), ctx)


# --- script forms --------------------------------------------------------------------------


def test_script_forms_parse_to_specs() -> None:
    assert NoteProcessor().parse({"note": "a.md"}) == note("a.md")
    assert FolderProcessor().parse({"folder": "docs"}) == folder("docs")
    assert TagProcessor().parse({"tag": "#A/b"}) == tag("a/b")
    assert tag("#A/b").describe() == "tag #a/b"


@pytest.mark.parametrize(
    ("processor", "data"),
    [
        (NoteProcessor(), {"note": 3}),
        (NoteProcessor(), {"note": ""}),
        (NoteProcessor(), {"note": "a.md", "extra": 1}),
        (FolderProcessor(), {"folder": None}),
        (TagProcessor(), {"tag": ["x"]}),
        (TagProcessor(), {"tag": "#123"}),
        (TagProcessor(), {"tag": "#"}),
    ],
)
def test_bad_script_forms_are_attachment_errors(processor: object, data: dict[str, object]) -> None:
    with pytest.raises(AttachmentError):
        processor.parse(data)  # type: ignore[attr-defined]


# --- the example vault ----------------------------------------------------------------------


def test_example_vault_demo_notes() -> None:
    ctx = ProcessContext(vault=Vault(EXAMPLE_VAULT))
    spec: Processed = NoteProcessor().process(note("project-spec.md"), ctx)
    api: Processed = NoteProcessor().process(note("docs/api-docs.md"), ctx)
    # The spec stays under the L2 verbatim threshold (shown in full in L2, then referenced).
    assert 4_000 <= len(spec.artifacts[0].payload.body()) <= 5_600
    assert 5_000 <= len(api.artifacts[0].payload.body()) <= 7_500
    assert Link("note:project-spec.md", "note:docs/api-docs.md", "links") in spec.links
    assert not spec.warnings and not api.warnings
    lamina = TagProcessor().process(tag("#project/lamina"), ctx)
    assert "note:meetings/2026-11-02.md" in [a.key for a in lamina.artifacts]
