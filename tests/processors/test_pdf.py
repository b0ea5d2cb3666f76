"""PDF attachments: text per page, page ranges in the key, caps and typed failures."""

from __future__ import annotations

import io
import random
from pathlib import Path

import pypdf
import pytest
from fpdf import FPDF

from lamina.pipeline.errors import AttachmentError, ConfigError, PathOutsideVault, PdfError
from lamina.pipeline.sources import TurnWarning
from lamina.processors._context import ProcessContext
from lamina.processors._pdf import (
    EMPTY_PAGE,
    GARBAGE_PAGE,
    NO_TEXT,
    XFA_FORM,
    PdfPayload,
    PdfProcessor,
    format_page_range,
    parse_page_range,
    pdf,
)
from lamina.processors._vault import Vault

PAGES = [
    "Alpha page one talks about lattices.",
    "Bravo page two covers caching and prefixes.",
    "Charlie page three is about budgets.",
    "Delta page four explains references.",
    "Echo page five closes the report.",
]


def make_pdf(pages: list[str], title: str | None = None) -> bytes:
    doc = FPDF()
    doc.set_font("Helvetica", size=12)
    if title is not None:
        doc.set_title(title)
    for text in pages:
        doc.add_page()
        if text:
            doc.multi_cell(0, 8, text)
    return bytes(doc.output())


def image_only_pdf() -> bytes:
    from PIL import Image

    picture = io.BytesIO()
    Image.new("RGB", (40, 30), (200, 30, 30)).save(picture, format="PNG")
    doc = FPDF()
    for _ in range(2):
        doc.add_page()
        doc.rect(20, 20, 100, 60, style="F")
        doc.image(io.BytesIO(picture.getvalue()), x=30, y=100, w=40)
    return bytes(doc.output())


def encrypted(data: bytes, user_password: str) -> bytes:
    writer = pypdf.PdfWriter(clone_from=pypdf.PdfReader(io.BytesIO(data)))
    writer.encrypt(
        user_password=user_password, owner_password="owner", algorithm="RC4-128"
    )  # no `cryptography` needed
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


@pytest.fixture
def vault_dir(tmp_path: Path) -> Path:
    root = tmp_path / "vault"
    (root / "docs").mkdir(parents=True)
    (root / "docs" / "report.pdf").write_bytes(make_pdf(PAGES, title="Quarterly Report"))
    return root


@pytest.fixture
def ctx(vault_dir: Path) -> ProcessContext:
    return ProcessContext(vault=Vault(vault_dir))


def run(spec_path: str, ctx: ProcessContext, pages: str | None = None) -> PdfPayload:
    processed = PdfProcessor().process(pdf(spec_path, pages), ctx)
    (artifact,) = processed.artifacts
    assert isinstance(artifact.payload, PdfPayload)
    return artifact.payload


def write(vault_dir: Path, name: str, data: bytes) -> str:
    (vault_dir / name).write_bytes(data)
    return name


def test_extracts_the_known_text_of_every_page(ctx: ProcessContext) -> None:
    payload = run("docs/report.pdf", ctx)
    assert payload.page_texts == tuple((i + 1, text) for i, text in enumerate(PAGES))
    assert payload.page_count == 5
    assert not payload.truncated
    assert not payload.image_only


def test_body_marks_each_page_with_a_heading(ctx: ProcessContext) -> None:
    body = run("docs/report.pdf", ctx).body()
    expected = "\n\n".join(f"## Page {i + 1}\n\n{text}" for i, text in enumerate(PAGES))
    assert body == expected


def test_whole_file_key_attributes_and_title(ctx: ProcessContext) -> None:
    (artifact,) = PdfProcessor().process(pdf("docs/./report.pdf"), ctx).artifacts
    assert artifact.key == "pdf:docs/report.pdf"
    assert artifact.recoverable
    assert artifact.title == "Quarterly Report"
    assert artifact.payload.attributes() == (("path", "docs/report.pdf"),)


def test_title_falls_back_to_the_file_stem(vault_dir: Path, ctx: ProcessContext) -> None:
    name = write(vault_dir, "untitled-notes.pdf", make_pdf(["Some text."]))
    assert run(name, ctx).title == "untitled-notes"


def test_page_range_selects_pages_and_is_part_of_the_key(ctx: ProcessContext) -> None:
    (artifact,) = PdfProcessor().process(pdf("docs/report.pdf", "4, 1-2"), ctx).artifacts
    payload = artifact.payload
    assert isinstance(payload, PdfPayload)
    assert artifact.key == "pdf:docs/report.pdf#pages=1-2,4"
    assert [n for n, _ in payload.page_texts] == [1, 2, 4]
    assert payload.page_texts[2] == (4, PAGES[3])
    assert payload.attributes() == (("path", "docs/report.pdf"), ("pages", "1-2,4"))
    assert "## Page 3" not in payload.body()


def test_whole_file_and_ranged_artifacts_have_different_keys(ctx: ProcessContext) -> None:
    whole = PdfProcessor().process(pdf("docs/report.pdf"), ctx).artifacts[0]
    ranged = PdfProcessor().process(pdf("docs/report.pdf", "1-5"), ctx).artifacts[0]
    assert whole.key != ranged.key
    assert whole.content_hash != ranged.content_hash


@pytest.mark.parametrize(
    ("text", "spans", "canonical"),
    [
        ("1-3,7", ((1, 3), (7, 7)), "1-3,7"),
        ("7, 1-3", ((1, 3), (7, 7)), "1-3,7"),
        ("3,1-2", ((1, 3),), "1-3"),
        ("2-4,3-6", ((2, 6),), "2-6"),
        ("5,5,5", ((5, 5),), "5"),
        ("2-2", ((2, 2),), "2"),
        (" 10 - 12 ", ((10, 12),), "10-12"),
        (4, ((4, 4),), "4"),
    ],
)
def test_page_ranges_normalize(
    text: str | int, spans: tuple[tuple[int, int], ...], canonical: str
) -> None:
    assert parse_page_range(text) == spans
    assert format_page_range(spans) == canonical


@pytest.mark.parametrize(
    "text", ["0", "3-1", "a", "1-", "-2", "1,,2", "1;2", "", "1-2-3", "x" * 300]
)
def test_bad_page_ranges_are_refused(text: str) -> None:
    with pytest.raises(PdfError) as info:
        pdf("docs/report.pdf", text or ",")
    assert info.value.reason == "pages"
    assert info.value.path == "docs/report.pdf"


def test_range_past_the_last_page_is_a_pages_error(ctx: ProcessContext) -> None:
    with pytest.raises(PdfError) as info:
        run("docs/report.pdf", ctx, "2,9")
    assert info.value.reason == "pages"
    assert "9" in str(info.value) and "5 pages" in str(info.value)


def test_password_protected_pdf_is_an_encrypted_error(vault_dir: Path, ctx: ProcessContext) -> None:
    name = write(vault_dir, "secret.pdf", encrypted(make_pdf(PAGES[:2]), "s3cret"))
    with pytest.raises(PdfError) as info:
        run(name, ctx)
    assert info.value.reason == "encrypted"
    assert info.value.path == "secret.pdf"


def test_owner_only_encryption_still_reads(vault_dir: Path, ctx: ProcessContext) -> None:
    name = write(vault_dir, "locked-edits.pdf", encrypted(make_pdf(PAGES[:2]), ""))
    assert run(name, ctx).page_texts == ((1, PAGES[0]), (2, PAGES[1]))


@pytest.mark.parametrize("fraction", [0.1, 0.5, 0.9, 0.99])
def test_truncated_bytes_are_a_corrupt_error(
    vault_dir: Path, ctx: ProcessContext, fraction: float
) -> None:
    data = make_pdf(PAGES)
    name = write(vault_dir, "cut.pdf", data[: int(len(data) * fraction)])
    with pytest.raises(PdfError) as info:
        run(name, ctx)
    assert info.value.reason == "corrupt"


def test_random_garbage_is_a_corrupt_error(vault_dir: Path, ctx: ProcessContext) -> None:
    rng = random.Random(7)
    name = write(vault_dir, "noise.pdf", bytes(rng.randrange(256) for _ in range(4096)))
    with pytest.raises(PdfError) as info:
        run(name, ctx)
    assert info.value.reason == "corrupt"


def test_garbage_between_a_header_and_eof_marker_is_corrupt_not_a_crash(
    vault_dir: Path, ctx: ProcessContext
) -> None:
    rng = random.Random(11)
    body = bytes(rng.randrange(256) for _ in range(4096))
    name = write(vault_dir, "fake.pdf", b"%PDF-1.7\n" + body + b"\n%%EOF\n")
    with pytest.raises(PdfError) as info:
        run(name, ctx)
    assert info.value.reason == "corrupt"


def test_image_only_pdf_is_a_flagged_empty_artifact(vault_dir: Path, ctx: ProcessContext) -> None:
    name = write(vault_dir, "scan.pdf", image_only_pdf())
    payload = run(name, ctx)
    assert payload.image_only
    assert payload.page_texts == ((1, ""), (2, ""))
    assert payload.body() == NO_TEXT


def test_a_page_without_text_is_marked_in_the_body(vault_dir: Path, ctx: ProcessContext) -> None:
    name = write(vault_dir, "gap.pdf", make_pdf(["First.", "", "Third."]))
    payload = run(name, ctx)
    assert not payload.image_only
    assert (
        payload.body() == f"## Page 1\n\nFirst.\n\n## Page 2\n\n{EMPTY_PAGE}\n\n## Page 3\n\nThird."
    )


def test_page_cap_extracts_the_first_pages_and_flags_truncation(vault_dir: Path) -> None:
    ctx = ProcessContext(vault=Vault(vault_dir), options={"pdf_max_pages": 2})
    payload = run("docs/report.pdf", ctx)
    assert payload.page_texts == ((1, PAGES[0]), (2, PAGES[1]))
    assert payload.truncated
    assert payload.page_count == 5
    assert payload.body().startswith("[Truncated: extracted the first 2 of 5 pages;")


def test_page_cap_applies_to_the_selected_pages(vault_dir: Path) -> None:
    ctx = ProcessContext(vault=Vault(vault_dir), options={"pdf_max_pages": 2})
    payload = run("docs/report.pdf", ctx, "2-5")
    assert [n for n, _ in payload.page_texts] == [2, 3]
    assert payload.body().startswith("[Truncated: extracted the first 2 of 4 selected pages;")


def test_default_page_cap_is_200(vault_dir: Path, ctx: ProcessContext) -> None:
    name = write(vault_dir, "long.pdf", make_pdf([f"Page {i}." for i in range(1, 206)]))
    payload = run(name, ctx)
    assert len(payload.page_texts) == 200
    assert payload.page_texts[-1] == (200, "Page 200.")
    assert payload.truncated


def test_bad_page_cap_option_is_a_config_error(vault_dir: Path) -> None:
    ctx = ProcessContext(vault=Vault(vault_dir), options={"pdf_max_pages": 0})
    with pytest.raises(ConfigError):
        run("docs/report.pdf", ctx)


def test_paths_escaping_the_vault_are_refused(tmp_path: Path, ctx: ProcessContext) -> None:
    (tmp_path / "outside.pdf").write_bytes(make_pdf(["Outside."]))
    with pytest.raises(PathOutsideVault):
        run("../outside.pdf", ctx)


def test_absolute_paths_are_refused_by_default(tmp_path: Path, ctx: ProcessContext) -> None:
    outside = tmp_path / "outside.pdf"
    outside.write_bytes(make_pdf(["Outside."]))
    with pytest.raises(PathOutsideVault):
        run(str(outside), ctx)


def test_absolute_paths_work_when_the_host_allows(tmp_path: Path, vault_dir: Path) -> None:
    outside = tmp_path / "outside.pdf"
    outside.write_bytes(make_pdf(["Outside."]))
    ctx = ProcessContext(vault=Vault(vault_dir), allow_absolute_paths=True)
    (artifact,) = PdfProcessor().process(pdf(str(outside)), ctx).artifacts
    assert artifact.key == f"pdf:{outside}"
    assert artifact.payload.body() == "## Page 1\n\nOutside."


def test_absolute_path_inside_the_vault_gets_the_relative_key(vault_dir: Path) -> None:
    ctx = ProcessContext(vault=Vault(vault_dir), allow_absolute_paths=True)
    spec = pdf(str(vault_dir / "docs" / "report.pdf"))
    assert PdfProcessor().process(spec, ctx).artifacts[0].key == "pdf:docs/report.pdf"


def test_missing_file_is_a_typed_error(ctx: ProcessContext) -> None:
    with pytest.raises(PdfError) as info:
        run("docs/nope.pdf", ctx)
    assert info.value.reason == "missing"


def test_script_form_parses_and_normalizes_pages() -> None:
    spec = PdfProcessor().parse({"pdf": "docs/report.pdf", "pages": "3,1-2"})
    assert spec == pdf("docs/report.pdf", "1-3")
    assert spec.kind == "pdf"
    assert spec.describe() == "pdf docs/report.pdf pages 1-3"


def test_script_form_refuses_unknown_fields() -> None:
    with pytest.raises(AttachmentError):
        PdfProcessor().parse({"pdf": "docs/report.pdf", "page": "1"})


def test_processing_twice_gives_the_same_hash(ctx: ProcessContext) -> None:
    first = PdfProcessor().process(pdf("docs/report.pdf"), ctx).artifacts[0]
    second = PdfProcessor().process(pdf("docs/report.pdf"), ctx).artifacts[0]
    assert first == second


def test_replace_text_maps_title_and_pages(ctx: ProcessContext) -> None:
    payload = run("docs/report.pdf", ctx, "1").replace_text(str.upper)
    assert payload.title == "QUARTERLY REPORT"
    assert payload.page_texts == ((1, PAGES[0].upper()),)


# --- PDFs that real people have ------------------------------------------------------


def process(name: str, ctx: ProcessContext) -> tuple[PdfPayload, tuple[TurnWarning, ...]]:
    processed = PdfProcessor().process(pdf(name), ctx)
    payload = processed.artifacts[0].payload
    assert isinstance(payload, PdfPayload)
    return payload, processed.warnings


def test_trailing_padding_after_eof_still_reads(vault_dir: Path, ctx: ProcessContext) -> None:
    """A scanner's 2 KB of padding after %%EOF: pdfium reads the file, so do we."""
    name = write(vault_dir, "padded.pdf", make_pdf(PAGES[:2]) + b"\0" * 2048)
    assert run(name, ctx).page_texts == ((1, PAGES[0]), (2, PAGES[1]))


def test_a_damaged_xref_still_reads(vault_dir: Path, ctx: ProcessContext) -> None:
    data = make_pdf(PAGES[:3])
    at = data.rindex(b"startxref\n") + len(b"startxref\n")
    end = data.index(b"\n", at)
    broken = data[:at] + b"999999" + data[end:]  # startxref points nowhere
    xref = broken.index(b"\nxref\n")
    broken = broken[:xref] + broken[xref:].replace(b" 00000 n", b" 00000 x", 2)
    name = write(vault_dir, "xref.pdf", broken)
    assert run(name, ctx).page_texts == tuple((i + 1, PAGES[i]) for i in range(3))


def test_a_garbage_text_layer_is_flagged_and_not_sent(vault_dir: Path, ctx: ProcessContext) -> None:
    garbage = ". , ; : ! ' - . , ; . : , . ! - ' , . ; : . , . ; ! , . - ; : ' . , ; . , !"
    name = write(vault_dir, "fonts.pdf", make_pdf([PAGES[0], garbage, garbage]))
    payload, warnings = process(name, ctx)
    assert payload.page_texts == ((1, PAGES[0]), (2, GARBAGE_PAGE), (3, GARBAGE_PAGE))
    assert GARBAGE_PAGE in payload.body() and "; :" not in payload.body()
    assert warnings == (
        TurnWarning(
            "pdf-garbage-text",
            "pdf:fonts.pdf",
            "pages 2-3: the text layer is spaces and punctuation (a broken font map); not sent",
        ),
    )


def test_real_text_in_other_scripts_is_not_garbage(vault_dir: Path, ctx: ProcessContext) -> None:
    name = write(vault_dir, "prose.pdf", make_pdf(["Numbers: 1, 2, 3; (a) [b] {c} - e.g. x/y."]))
    assert process(name, ctx)[1] == ()


def xfa_pdf() -> bytes:
    from pypdf.generic import (
        ArrayObject,
        DecodedStreamObject,
        DictionaryObject,
        NameObject,
        TextStringObject,
    )

    placeholder = make_pdf(["Please wait... your PDF viewer may not display this document."])
    writer = pypdf.PdfWriter(clone_from=pypdf.PdfReader(io.BytesIO(placeholder)))
    stream = DecodedStreamObject()
    stream.set_data(b"<xdp:xdp xmlns:xdp='http://ns.adobe.com/xdp/'><template/></xdp:xdp>")
    xfa = ArrayObject([TextStringObject("template"), writer._add_object(stream)])
    writer._root_object[NameObject("/AcroForm")] = DictionaryObject(
        {NameObject("/Fields"): ArrayObject(), NameObject("/XFA"): xfa}
    )
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def test_an_xfa_form_is_flagged_in_the_artifact_and_warned(
    vault_dir: Path, ctx: ProcessContext
) -> None:
    name = write(vault_dir, "form.pdf", xfa_pdf())
    payload, warnings = process(name, ctx)
    assert payload.xfa
    assert payload.body().startswith(XFA_FORM + "\n\n## Page 1\n\nPlease wait...")
    assert [(w.code, w.key) for w in warnings] == [("pdf-xfa", "pdf:form.pdf")]


def test_a_password_from_the_host_opens_the_pdf(vault_dir: Path) -> None:
    name = write(vault_dir, "secret.pdf", encrypted(make_pdf(PAGES[:2]), "s3cret"))
    ctx = ProcessContext(vault=Vault(vault_dir), pdf_passwords={name: "s3cret"})
    processed = PdfProcessor().process(pdf(name), ctx)
    assert processed.artifacts[0].payload.body() == (
        f"## Page 1\n\n{PAGES[0]}\n\n## Page 2\n\n{PAGES[1]}"
    )
    # The password is no part of the artifact, its key or its hash input.
    assert "s3cret" not in repr(processed) and "s3cret" not in repr(ctx)


@pytest.mark.parametrize(
    ("passwords", "message"),
    [
        ({}, "needs a password (none was given)"),
        ({"secret.pdf": "nope"}, "password given is wrong"),
    ],
)
def test_a_missing_or_wrong_password_is_an_encrypted_error(
    vault_dir: Path, passwords: dict[str, str], message: str
) -> None:
    name = write(vault_dir, "secret.pdf", encrypted(make_pdf(PAGES[:2]), "s3cret"))
    ctx = ProcessContext(vault=Vault(vault_dir), pdf_passwords=passwords)
    with pytest.raises(PdfError) as info:
        PdfProcessor().process(pdf(name), ctx)
    assert info.value.reason == "encrypted" and message in str(info.value)


def test_an_image_only_pdf_is_warned(vault_dir: Path, ctx: ProcessContext) -> None:
    name = write(vault_dir, "scan.pdf", image_only_pdf())
    warnings = process(name, ctx)[1]
    assert warnings == (
        TurnWarning("pdf-no-text", "pdf:scan.pdf", "no extractable text on any of its 2 pages"),
    )


def test_a_one_page_document_says_1_page(vault_dir: Path, ctx: ProcessContext) -> None:
    name = write(vault_dir, "one.pdf", make_pdf(PAGES[:1]))
    with pytest.raises(PdfError) as info:
        run(name, ctx, "2")
    assert "the document has 1 page)" in str(info.value)
