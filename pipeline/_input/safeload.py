"""Bounded YAML and JSON loading for everything Lamina parses from its input.

Scripts, transcript and note frontmatter and JSON transcripts all come from users or
other programs, so parsing is limited in size, nesting depth, alias use and expanded
node count (an alias bomb is refused before any object is built), and numbers are
checked before Python converts them: an integer longer than ``MAX_INT_DIGITS`` or a
non-finite float is refused, an impossible date stays the text it was. Every failure is
one ``LoadError`` carrying a problem and, when known, a 1-based line; callers turn it into
their own typed error (``ScriptError``, ``ChatTranscriptError``, a note warning, ...).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import attrs
import yaml
from yaml.constructor import ConstructorError, SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

_CParser: Any = getattr(yaml, "CParser", None)  # None when PyYAML was built without libyaml

__all__ = ["MAX_INT_DIGITS", "LoadError", "LoadLimits", "load_json", "load_yaml"]

MAX_INT_DIGITS = 100
"""Longer integers are refused: no count, id or timestamp Lamina reads needs more."""


class LoadError(ValueError):
    """YAML or JSON that is malformed or over a limit; ``line`` is 1-based, 0 when unknown."""

    def __init__(self, problem: str, line: int = 0) -> None:
        self.problem = problem
        self.line = line
        super().__init__(f"{problem} (line {line})" if line else problem)


@attrs.frozen
class LoadLimits:
    """Caps on one document: characters, nesting depth, aliases and nodes once aliases
    are expanded (what a consumer walking the value would visit)."""

    max_chars: int = 4_000_000
    max_depth: int = 64
    max_aliases: int = 256
    max_nodes: int = 200_000


DEFAULT_LIMITS = LoadLimits()


def _check_size(text: str, limits: LoadLimits) -> None:
    if len(text) > limits.max_chars:
        raise LoadError(f"the document is larger than {limits.max_chars:,} characters")


# --- YAML -------------------------------------------------------------------------------


class _Bounded:
    """Composer hooks shared by the safe and the string-only loader."""

    limits: LoadLimits = DEFAULT_LIMITS
    _depth = 0
    _aliases = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node:
        if self.check_event(yaml.AliasEvent):  # type: ignore[attr-defined]
            self._aliases += 1
            if self._aliases > self.limits.max_aliases:
                raise LoadError(
                    f"more than {self.limits.max_aliases} aliases", self._line()
                )
            return super().compose_node(parent, index)  # type: ignore[misc,no-any-return]
        self._depth += 1
        if self._depth > self.limits.max_depth:
            raise LoadError(f"nested deeper than {self.limits.max_depth} levels", self._line())
        try:
            return super().compose_node(parent, index)  # type: ignore[misc,no-any-return]
        finally:
            self._depth -= 1

    def _line(self) -> int:
        event = self.peek_event()  # type: ignore[attr-defined]
        return int(event.start_mark.line) + 1 if event is not None else 0


def _int_text(value: str) -> str:
    return value.replace("_", "").lstrip("+-")


class _SafeConstructor(SafeConstructor):
    """SafeConstructor with bounded integers, finite floats and lenient timestamps."""

    def construct_yaml_int(self, node: ScalarNode) -> int:
        digits = _int_text(str(self.construct_scalar(node)))
        if len(digits) > MAX_INT_DIGITS:
            raise LoadError(
                f"an integer of {len(digits):,} digits (the limit is {MAX_INT_DIGITS})",
                node.start_mark.line + 1,
            )
        return super().construct_yaml_int(node)

    def construct_yaml_float(self, node: ScalarNode) -> float:
        value = super().construct_yaml_float(node)
        if not math.isfinite(value):
            raise LoadError("numbers must be finite (not .inf or .nan)", node.start_mark.line + 1)
        return value

    def construct_yaml_timestamp(self, node: ScalarNode) -> Any:
        # An impossible date (2024-13-45) is text, as it is for YAML 1.2 and for editors.
        try:
            return super().construct_yaml_timestamp(node)
        except (ValueError, OverflowError):
            return str(self.construct_scalar(node))


for _tag, _method in (
    ("tag:yaml.org,2002:int", _SafeConstructor.construct_yaml_int),
    ("tag:yaml.org,2002:float", _SafeConstructor.construct_yaml_float),
    ("tag:yaml.org,2002:timestamp", _SafeConstructor.construct_yaml_timestamp),
):
    _SafeConstructor.add_constructor(_tag, _method)  # type: ignore[type-var]


class _SafeLoader(
    _Bounded,
    yaml.reader.Reader,
    yaml.scanner.Scanner,
    yaml.parser.Parser,
    yaml.composer.Composer,
    _SafeConstructor,
    yaml.resolver.Resolver,
):
    def __init__(self, stream: str) -> None:
        yaml.reader.Reader.__init__(self, stream)
        yaml.scanner.Scanner.__init__(self)
        yaml.parser.Parser.__init__(self)
        yaml.composer.Composer.__init__(self)
        _SafeConstructor.__init__(self)
        yaml.resolver.Resolver.__init__(self)


class _StringLoader(_Bounded, yaml.BaseLoader):
    """Every scalar stays a string (transcripts keep timestamps and epochs verbatim)."""


if _CParser is not None:  # libyaml parses ~50x faster; its events are checked first

    class _CSafeLoader(_CParser, _SafeConstructor, yaml.resolver.Resolver):  # type: ignore[misc]
        def __init__(self, stream: str) -> None:
            _CParser.__init__(self, stream)
            _SafeConstructor.__init__(self)
            yaml.resolver.Resolver.__init__(self)

    _LOADERS: dict[bool, Any] = {False: _CSafeLoader, True: yaml.CBaseLoader}
else:  # pragma: no cover - PyYAML built without libyaml
    _LOADERS = {False: _SafeLoader, True: _StringLoader}


def _event_line(event: yaml.Event) -> int:
    return event.start_mark.line + 1 if event.start_mark is not None else 0


def _check_events(text: str, limits: LoadLimits) -> None:
    """Depth and alias count from libyaml's (iterative) event stream, before composing."""
    parser = _CParser(text)
    depth = aliases = 0
    try:
        while (event := parser.get_event()) is not None:
            if isinstance(event, yaml.AliasEvent):
                aliases += 1
                if aliases > limits.max_aliases:
                    raise LoadError(f"more than {limits.max_aliases} aliases", _event_line(event))
            elif isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                if depth > limits.max_depth:
                    raise LoadError(
                        f"nested deeper than {limits.max_depth} levels", _event_line(event)
                    )
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
    finally:
        parser.dispose()


def _expanded_size(root: Node, limits: LoadLimits) -> None:
    """Refuse a graph whose alias-expanded size or depth is over the limits, or a cycle."""
    sizes: dict[int, tuple[int, int]] = {}  # id -> (nodes, depth) once expanded
    stack: list[tuple[Node, bool]] = [(root, False)]
    open_: set[int] = set()
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            children = _children(node)
            nodes = 1 + sum(sizes[id(c)][0] for c in children)
            depth = 1 + max((sizes[id(c)][1] for c in children), default=0)
            if nodes > limits.max_nodes:
                raise LoadError(
                    f"more than {limits.max_nodes:,} values once aliases are expanded",
                    node.start_mark.line + 1,
                )
            if depth > limits.max_depth:
                raise LoadError(
                    f"nested deeper than {limits.max_depth} levels once aliases are expanded",
                    node.start_mark.line + 1,
                )
            sizes[key] = (nodes, depth)
            open_.discard(key)
            continue
        if key in sizes:
            continue
        if key in open_:
            line = node.start_mark.line + 1
            raise LoadError("a recursive alias (a value that contains itself)", line)
        open_.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in _children(node) if id(c) not in sizes)


def _children(node: Node) -> list[Node]:
    if isinstance(node, SequenceNode):
        return list(node.value)
    if isinstance(node, MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def load_yaml(text: str, limits: LoadLimits = DEFAULT_LIMITS, *, strings: bool = False) -> Any:
    """One YAML document as Python values, within ``limits``; ``strings`` keeps scalars text."""
    _check_size(text, limits)
    loader = _LOADERS[strings](text)
    loader.limits = limits
    try:
        if _CParser is not None:
            _check_events(text, limits)
        node = loader.get_single_node()
        if node is None:
            return None
        _expanded_size(node, limits)
        return loader.construct_document(node)
    except LoadError:
        raise
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else 0
        raise LoadError(f"not valid YAML: {exc.problem}", line) from None
    except (yaml.YAMLError, ConstructorError) as exc:
        raise LoadError(f"not valid YAML: {exc}") from None
    except RecursionError:  # a limit above the interpreter's own stack
        raise LoadError("nested deeper than this Python can parse") from None
    finally:
        loader.dispose()


# --- JSON -------------------------------------------------------------------------------

_JSON_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]', re.S)


def _json_depth(text: str, limits: LoadLimits) -> None:
    """A linear scan for nesting depth, before the (recursive) decoder runs."""
    if "[" not in text and "{" not in text:
        return
    depth = 0
    for m in _JSON_TOKEN.finditer(text):
        token = m.group()
        if token in "[{":
            depth += 1
            if depth > limits.max_depth:
                raise LoadError(
                    f"nested deeper than {limits.max_depth} levels",
                    text.count("\n", 0, m.start()) + 1,
                )
        elif token in "]}":
            depth -= 1


def _json_int(text: str) -> int:
    if (digits := len(_int_text(text))) > MAX_INT_DIGITS:
        raise LoadError(f"an integer of {digits:,} digits (the limit is {MAX_INT_DIGITS})")
    return int(text)


def _json_float(text: str) -> float:
    if len(text) > MAX_INT_DIGITS + 20:
        raise LoadError(f"a number of {len(text):,} characters")
    value = float(text)
    if not math.isfinite(value):
        raise LoadError(f"the number {text[:20]} is out of range")
    return value


def _json_constant(name: str) -> Any:
    raise LoadError(f"{name} is not JSON (numbers must be finite)")


def load_json(text: str, limits: LoadLimits = DEFAULT_LIMITS) -> Any:
    """One JSON document, within ``limits``; NaN and Infinity are refused."""
    _check_size(text, limits)
    _json_depth(text, limits)
    try:
        return json.loads(
            text, parse_int=_json_int, parse_float=_json_float, parse_constant=_json_constant
        )
    except json.JSONDecodeError as exc:
        raise LoadError(f"not valid JSON: {exc.msg}", exc.lineno) from None
    except RecursionError:
        raise LoadError("nested deeper than this Python can parse") from None
