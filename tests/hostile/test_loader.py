"""The bounded YAML/JSON loader: limits hold before objects are built, and any text gives
a value or a LoadError, never another exception."""

from __future__ import annotations

import contextlib
import datetime
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lamina.pipeline._input.safeload import LoadError, LoadLimits, load_json, load_yaml
from tests.hostile.corpus import BIG_INT, alias_bomb, deep_block, deep_flow


def test_an_alias_bomb_is_refused_by_its_expanded_size() -> None:
    with pytest.raises(LoadError, match="once aliases are expanded") as info:
        load_yaml(alias_bomb())
    assert info.value.line > 1


def test_a_small_alias_use_still_loads() -> None:
    assert load_yaml("base: &b {x: 1}\nuse: *b\n") == {"base": {"x": 1}, "use": {"x": 1}}


def test_the_alias_count_is_limited() -> None:
    text = "a: &a 1\nb: [" + ", ".join(["*a"] * 300) + "]\n"
    with pytest.raises(LoadError, match="more than 256 aliases"):
        load_yaml(text)


def test_aliases_cannot_nest_deeper_than_the_limit() -> None:
    """Each anchor adds 8 levels to the last: the text is shallow, the value is not."""
    lines = ["a0: &a0 [[[[[[[[1]]]]]]]]"]
    lines += [f"a{i}: &a{i} [[[[[[[[*a{i - 1}]]]]]]]]" for i in range(1, 12)]
    with pytest.raises(LoadError, match="deeper than 64 levels once aliases are expanded"):
        load_yaml("\n".join(lines))


@pytest.mark.parametrize("strings", [False, True])
def test_recursive_aliases_are_refused(strings: bool) -> None:
    with pytest.raises(LoadError, match="recursive alias"):
        load_yaml("a: &a [1, *a]\n", strings=strings)


@pytest.mark.parametrize("text", [deep_flow(), deep_block()])
def test_deep_yaml_is_refused(text: str) -> None:
    with pytest.raises(LoadError, match="nest"):
        load_yaml(text)


def test_depth_up_to_the_limit_loads() -> None:
    assert load_yaml("[" * 64 + "]" * 64) is not None
    assert load_json("[" * 64 + "]" * 64) is not None
    with pytest.raises(LoadError):
        load_json("[" * 65 + "]" * 65)


def test_brackets_inside_json_strings_do_not_count_as_depth() -> None:
    text = json.dumps({"s": "[" * 1000 + '\\"{' * 100})
    assert load_json(text) == json.loads(text)


@pytest.mark.parametrize("loader", [load_yaml, load_json])
def test_long_integers_are_refused_before_conversion(loader: object) -> None:
    with pytest.raises(LoadError, match="5,000 digits"):
        loader(f"[{BIG_INT}]")  # type: ignore[operator]


@pytest.mark.parametrize("text", ["[Infinity]", "[-Infinity]", "[NaN]", "[1e999]", "[-1e400]"])
def test_non_finite_json_numbers_are_refused(text: str) -> None:
    with pytest.raises(LoadError):
        load_json(text)


@pytest.mark.parametrize("text", ["x: .inf", "x: -.Inf", "x: .nan", "x: 1.0e+999"])
def test_non_finite_yaml_numbers_are_refused(text: str) -> None:
    with pytest.raises(LoadError, match="finite"):
        load_yaml(text)


def test_impossible_dates_stay_text_and_real_dates_stay_dates() -> None:
    assert load_yaml("a: 2024-13-45\nb: 2024-02-30\nc: 2024-02-29") == {
        "a": "2024-13-45",
        "b": "2024-02-30",
        "c": datetime.date(2024, 2, 29),
    }


def test_the_string_loader_keeps_every_scalar_text() -> None:
    assert load_yaml("epoch: 1712345678901\nd: 2024-13-45\n", strings=True) == {
        "epoch": "1712345678901",
        "d": "2024-13-45",
    }


def test_the_size_limit_applies_before_parsing() -> None:
    with pytest.raises(LoadError, match="larger than 10 characters"):
        load_yaml("x: 12345678901", LoadLimits(max_chars=10))


def test_syntax_errors_carry_a_line() -> None:
    with pytest.raises(LoadError, match="not valid YAML") as info:
        load_yaml("a: 1\nb: [1, 2\n")
    assert info.value.line >= 2


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from("[]{}&*ab:-,!'\"\n .0123456789e#|>?"), max_size=200))
def test_any_yaml_text_loads_or_raises_load_error(text: str) -> None:
    for strings in (False, True):
        with contextlib.suppress(LoadError):
            load_yaml(text, strings=strings)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from('[]{}",:0123456789eE.-+ INaftyrul\\'), max_size=200))
def test_any_json_text_loads_or_raises_load_error(text: str) -> None:
    with contextlib.suppress(LoadError):
        load_json(text)
