"""Segment text as Lamina's XML-shaped blocks: content as written, nothing can break out.

Bodies and attribute values are escaped by the one rule in ``lamina.pipeline._text.markup``: only a
``<`` that could open a Lamina block, close the enclosing one, or start a comment or CDATA
section that never ends is written ``&lt;``; ``>``, ``&`` and other markup stay as written.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from lamina.pipeline import Form, View
from lamina.pipeline.errors import RegistryError
from lamina.pipeline.text import escape_attribute, escape_body, xml_safe
from lamina.pipeline.views import ViewMemo

__all__ = ["XmlRenderer", "render_xml", "xml_safe"]

_NAME = re.compile(r"^[A-Za-z_][\w.-]*$")

ViewRenderer = Callable[[View], str]


def _open(tag: str, attributes: list[tuple[str, str]], end: str) -> str:
    parts = [tag if _NAME.match(tag) else "context"]
    for name, value in attributes:
        if _NAME.match(name):
            parts.append(f'{name}="{escape_attribute(xml_safe(value))}"')
    return "<" + " ".join(parts) + end


def render_xml(view: View) -> str:
    """The default rendering: ``<source_type key title ...attrs [form] [marks]>body</...>``.

    References render as an empty ``<reference/>`` element that keeps key, title and
    locator, so the model can find the entry in the library or ask for it again.
    """
    attrs = [("key", view.key), ("title", view.title), *view.attributes]
    if view.form is Form.REFERENCE:
        return _open(
            "reference",
            [("key", view.key), ("source", view.source_type), *attrs[1:], *view.marks],
            "/>",
        )
    if view.form is not Form.FULL:
        attrs.append(("form", str(view.form)))
    tag = view.source_type if _NAME.match(view.source_type) else "context"
    head = _open(tag, [*attrs, *view.marks], ">")
    return f"{head}\n{escape_body(xml_safe(view.body), tag)}\n</{tag}>"


class XmlRenderer:
    """Dispatches by (source type, form) to registered renderers, else ``render_xml``.

    Renderings are memoized by view (a bounded LRU, by count and by characters): the same
    view is rendered once per turn and across turns, and L2 and L3 share one string
    instead of holding two copies. The memo (``memo``) starts at ``memo_size`` entries and
    a conversation grows it to what each turn renders (``ViewMemo.reserve``), up to
    ``memo_max_size`` (0: fixed) and ``memo_chars`` characters, whichever binds first.
    """

    def __init__(
        self, memo_size: int = 4096, memo_chars: int = 16 << 20, memo_max_size: int = 16_384
    ) -> None:
        self._custom: dict[tuple[str, Form], ViewRenderer] = {}
        self._memo = ViewMemo(memo_size, max_chars=memo_chars, max_size=memo_max_size)

    @property
    def memo(self) -> ViewMemo:
        """The renderings memo (its ``hits`` and ``made`` are the report's meters)."""
        return self._memo

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
