"""Segment text as XML built with lxml, so no content can break out of its block."""

from __future__ import annotations

import re
from collections.abc import Callable

from lxml import etree

from pipeline import RegistryError, ViewMemo
from pipeline._envelope import Form, View

__all__ = ["XmlRenderer", "render_xml", "xml_safe"]

# XML 1.0 cannot carry C0 controls (other than tab, LF, CR) at all, not even escaped:
# they become their visible Unicode "control picture" (NUL -> U+2400), so the model
# still sees that something was there; other illegal code points become U+FFFD.
_C0 = {c: 0x2400 + c for c in range(0x20) if c not in (0x09, 0x0A, 0x0D)}
_ILLEGAL = re.compile("[\ud800-\udfff\ufffe\uffff]")
_NAME = re.compile(r"^[A-Za-z_][\w.-]*$")

ViewRenderer = Callable[[View], str]


_UNSAFE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def xml_safe(text: str) -> str:
    """``text`` with the code points XML 1.0 cannot hold replaced (see module comment)."""
    if _UNSAFE.search(text) is None:  # the usual case: one scan, no copy
        return text
    return _ILLEGAL.sub("\ufffd", text.translate(_C0))


def _element(tag: str, attributes: list[tuple[str, str]]) -> etree._Element:
    el = etree.Element(tag if _NAME.match(tag) else "context")
    for name, value in attributes:
        el.set(name, xml_safe(value))
    return el


def render_xml(view: View) -> str:
    """The default rendering: ``<source_type key title ...attrs [form] [marks]>body</...>``.

    References render as an empty ``<reference/>`` element that keeps key, title and
    locator, so the model can find the entry in the library or ask for it again.
    """
    attrs = [("key", view.key), ("title", view.title), *view.attributes]
    if view.form is Form.REFERENCE:
        el = _element(
            "reference", [("key", view.key), ("source", view.source_type), *attrs[1:], *view.marks]
        )
        return etree.tostring(el, encoding="unicode")
    if view.form is not Form.FULL:
        attrs.append(("form", str(view.form)))
    el = _element(view.source_type, [*attrs, *view.marks])
    el.text = "\n" + xml_safe(view.body) + "\n"
    return etree.tostring(el, encoding="unicode")


class XmlRenderer:
    """Dispatches by (source type, form) to registered renderers, else ``render_xml``.

    Renderings are memoized by view (a bounded LRU): the same view is rendered once per
    turn and across turns, and L2 and L3 share one string instead of holding two copies.
    """

    def __init__(self, memo_size: int = 4096) -> None:
        self._custom: dict[tuple[str, Form], ViewRenderer] = {}
        self._memo = ViewMemo(memo_size)

    def register(self, source_type: str, form: Form | str, renderer: ViewRenderer) -> None:
        key = (source_type, Form(form))
        if key in self._custom:
            raise RegistryError(f"{source_type}/{form}", "a renderer is already registered")
        self._custom[key] = renderer
        self._memo.clear()  # earlier renderings may have used the default for this key

    def render(self, view: View) -> str:
        def make() -> str:
            return self._custom.get((view.source_type, view.form), render_xml)(view)

        return self._memo.get(view, make)
