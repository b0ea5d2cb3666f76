"""Example Lamina plugin: local CSV files (in the vault) attached as markdown tables.

Installed, it registers through the ``lamina.processors`` entry point, so
``{"csv": "data/x.csv", "rows": 50}`` works in scripts and ``csv_file(...)`` in Python.
"""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Callable, Mapping
from pathlib import PurePosixPath
from types import MappingProxyType
from typing import Any, Self

import attrs
from lxml import etree

from lamina.pipeline import View
from lamina.pipeline.errors import AttachmentError
from lamina.pipeline.sources import LabelLookup, Processed, make_artifact
from lamina.pipeline.text import escape_body
from lamina.processors import BaseProcessor, ProcessContext
from lamina.renderers import render_xml, xml_safe

__all__ = [
    "DEFAULT_ROWS",
    "MAX_BYTES",
    "CsvPayload",
    "CsvProcessor",
    "CsvSpec",
    "csv_file",
    "render_csv",
]

DEFAULT_ROWS = 200
"""Rows shown when the attachment does not say; the rest are counted, not sent."""
MAX_BYTES = 16 * 1024 * 1024
"""Files larger than this are refused rather than read into memory."""


@attrs.frozen
class CsvPayload:
    """A CSV file's header and its first rows, all cells as text."""

    path: str
    title: str
    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    total_rows: int

    @property
    def locator(self) -> str:
        return self.path

    def body(self) -> str:
        """A markdown table, and a line saying how many rows were left out."""
        if not self.header:
            return "(empty CSV file)"
        width = max([len(self.header), *(len(row) for row in self.rows)])
        lines = [
            _table_row(_pad(self.header, width)),
            "|" + " --- |" * width,
            *(_table_row(_pad(row, width)) for row in self.rows),
        ]
        if self.total_rows > len(self.rows):
            lines.append("")
            lines.append(
                f"[Showing the first {len(self.rows)} of {self.total_rows} rows; "
                "attach with a larger rows value to see more.]"
            )
        return "\n".join(lines)

    def attributes(self) -> tuple[tuple[str, str], ...]:
        return (("path", self.path), ("rows", str(self.total_rows)))

    def replace_text(self, fn: Callable[[str], str]) -> Self:
        return attrs.evolve(
            self,
            title=fn(self.title),
            header=tuple(fn(cell) for cell in self.header),
            rows=tuple(tuple(fn(cell) for cell in row) for row in self.rows),
        )


def _pad(cells: tuple[str, ...], width: int) -> tuple[str, ...]:
    return cells + ("",) * (width - len(cells))


def _table_row(cells: tuple[str, ...]) -> str:
    escaped = (" ".join(c.split()).replace("|", "\\|") for c in cells)
    return "| " + " | ".join(escaped) + " |"


@attrs.frozen
class CsvSpec:
    """A CSV file to attach: vault-relative path and how many rows to show."""

    path: str
    rows: int = DEFAULT_ROWS
    kind: str = attrs.field(default="csv", init=False)

    def describe(self) -> str:
        return f"csv {self.path} (first {self.rows} rows)"


def csv_file(path: str, rows: int | None = None) -> CsvSpec:
    """Attach the CSV file at vault-relative ``path``, showing at most ``rows`` rows."""
    if not isinstance(path, str) or not path.strip():
        raise AttachmentError(repr(path)[:60], "a CSV path must be a non-empty string")
    if rows is None:
        return CsvSpec(path)
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
        raise AttachmentError(f"csv {path}", f"rows must be a positive integer, not {rows!r}")
    return CsvSpec(path, rows)


def render_csv(view: View) -> str:
    """``<csv key title path rows>`` holding the table in CDATA; a body that holds ``]]>``
    (which would end the CDATA block) or anything Lamina's escaping rule rewrites (a
    ``</csv>``, a block opener) falls back to the default rendering."""
    body = xml_safe(view.body)
    if "]]>" in body or escape_body(body, "csv") != body:
        return render_xml(view)
    el = etree.Element("csv")
    for name, value in (("key", view.key), ("title", view.title), *view.attributes, *view.marks):
        el.set(name, xml_safe(value))
    el.text = etree.CDATA("\n" + body + "\n")
    return etree.tostring(el, encoding="unicode")


class CsvProcessor(BaseProcessor):
    """CSV files inside the vault, read with the standard csv module."""

    kind = "csv"
    category = "CSV files"
    renderers: Mapping[tuple[str, str], Callable[[View], str]] = MappingProxyType(
        {("csv", "full"): render_csv}
    )

    def script_form(self, spec: CsvSpec) -> dict[str, Any]:
        """``{"csv": path}``, with ``rows`` when it is not the default."""
        return {"csv": spec.path} | ({"rows": spec.rows} if spec.rows != DEFAULT_ROWS else {})

    def label(self, form: Mapping[str, Any]) -> str:
        """The path, with ``#rows=`` when the attachment asked for another row count."""
        rows = form.get("rows")
        path = str(form["csv"])
        return f"{path}#rows={rows}" if rows not in (None, DEFAULT_ROWS) else path

    def from_label(
        self, label: str, lookup: LabelLookup, ctx: ProcessContext
    ) -> tuple[dict[str, Any], str]:
        path, _, rows = label.partition("#rows=")
        return {"csv": path} | ({"rows": int(rows)} if rows.isdigit() else {}), label

    def parse(self, data: Mapping[str, Any]) -> CsvSpec:
        unknown = sorted(set(data) - {"csv", "rows"})
        if unknown:
            raise AttachmentError(
                f"csv {data.get('csv')!r}", f"unknown fields: {', '.join(unknown)}"
            )
        return csv_file(data["csv"], data.get("rows"))

    def process(self, spec: CsvSpec, ctx: ProcessContext) -> Processed:
        if ctx.vault is None:
            raise AttachmentError(f"csv {spec.path}", "a CSV path needs a vault")
        rel = ctx.vault.resolve(spec.path)  # refuses absolute paths and escapes
        text, warning = _read(os.path.join(ctx.vault.root, rel), rel)
        delimiter = "\t" if rel.lower().endswith(".tsv") else ","
        try:
            records = [tuple(row) for row in csv.reader(io.StringIO(text), delimiter=delimiter)]
        except csv.Error as exc:
            raise AttachmentError(f"csv {rel}", f"not readable as CSV: {exc}") from None
        records = [row for row in records if any(cell.strip() for cell in row)]
        header, data = (records[0], records[1:]) if records else ((), [])
        payload = CsvPayload(
            path=rel,
            title=PurePosixPath(rel).stem,
            header=header,
            rows=tuple(data[: spec.rows]),
            total_rows=len(data),
        )
        artifact = make_artifact("csv", f"csv:{rel}", payload, recoverable=True)
        return Processed((artifact,), warnings=(warning,) if warning else ())


def _read(path: str, rel: str) -> tuple[str, str | None]:
    """The file's text (BOM dropped) and a warning if bytes were not UTF-8."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_BYTES + 1)
    except (FileNotFoundError, NotADirectoryError):
        raise AttachmentError(f"csv {rel}", "no such file in the vault") from None
    except IsADirectoryError:
        raise AttachmentError(f"csv {rel}", "the path is a directory, not a CSV file") from None
    except OSError as exc:
        raise AttachmentError(f"csv {rel}", f"cannot read: {exc.strerror or exc}") from None
    if len(data) > MAX_BYTES:
        raise AttachmentError(f"csv {rel}", f"the file is larger than {MAX_BYTES} bytes")
    try:
        return data.decode("utf-8-sig"), None
    except UnicodeDecodeError as exc:
        warning = (
            f"{rel}: not valid UTF-8 (first bad byte at offset {exc.start}); "
            "undecodable bytes were replaced with U+FFFD"
        )
        return data.decode("utf-8-sig", errors="replace"), warning
