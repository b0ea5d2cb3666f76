"""One record per benchmark target: what was measured against which bound, and whether
it was met (the build points and the memory point write the same shape)."""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

__all__ = ["target"]

_OPS: dict[str, Callable[[float, float], bool]] = {
    "<=": operator.le,
    "<": operator.lt,
    ">=": operator.ge,
    ">": operator.gt,
}


def target(
    name: str,
    where: str,
    value: float | None,
    op: str,
    bound: float,
    full_scale: bool = True,
    unit: str | None = None,
) -> dict[str, Any]:
    """The target ``name`` at ``where``: ``value`` compared with ``bound`` by ``op``
    (None when not measured); ``unit`` is added when given."""
    record: dict[str, Any] = {
        "target": name,
        "where": where,
        "measured": value,
        "bound": f"{op} {bound:g}",
        "met": None if value is None else _OPS[op](value, bound),
        "at_target_scale": full_scale,
    }
    if unit is not None:
        record["unit"] = unit
    return record
