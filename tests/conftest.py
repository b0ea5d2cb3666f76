"""Shared fixtures: a small vault written into tmp_path for each test that asks, and
a store on each backend (SQLite file, PostgreSQL database on a throwaway cluster)."""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from lamina.pipeline._tokens.counter import shared_counts
from lamina.pipeline.tokens import TOKENIZERS
from lamina.pipeline.views import shared_views, summary_pool
from tests.stores import BACKENDS, Backend, PgServer, make_backend, pg_cluster

# In CI the property tests draw the same examples every run, so a run's time and outcome
# repeat (a new failure is found locally, where draws stay random).
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI") == "true":
    settings.load_profile("ci")

SPEC = """---
title: Project Spec
tags: [project]
---
# Project Spec

The sync service keeps notebooks in step across devices.

## Goals

- Edits appear everywhere within ten seconds.
- No edit is lost silently.
"""

API = """# API

See [[project-spec]].

## Endpoints

- `GET /v1/notebooks` lists notebooks.
- `POST /v1/ops` pushes operations.
"""

AUTH = """# Auth

Tokens expire after one hour. #security
"""


def write_vault(root: Path, notes: dict[str, str]) -> Path:
    for rel, text in notes.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root


@pytest.fixture(autouse=True)
def _fresh_process_memos() -> None:
    """Each test starts with an empty process summary pool, view memo and count memos, so counted
    summarizer calls, encoded characters and restored renderings do not depend on which
    tests ran before."""
    summary_pool().clear()
    shared_views().clear()
    for name in TOKENIZERS:
        shared_counts(name).clear()


@pytest.fixture
def vault(tmp_path: Path) -> Path:
    """A three-note vault: project-spec.md, docs/api-docs.md, docs/auth.md."""
    return write_vault(
        tmp_path / "vault",
        {"project-spec.md": SPEC, "docs/api-docs.md": API, "docs/auth.md": AUTH},
    )


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    """A PostgreSQL cluster for the whole session (skipped outside CI when absent)."""
    with pg_cluster() as server:
        yield server


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    """An empty store on each backend: a SQLite file, then a fresh PostgreSQL database."""
    server = request.getfixturevalue("pg_server") if request.param == "postgres" else None
    return make_backend(request.param, tmp_path, server)


@pytest.fixture
def new_backend(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Callable[[str], Backend]:
    """Makes another empty store on the named backend (for tests that use two stores)."""
    numbers = itertools.count()

    def make(name: str) -> Backend:
        server = request.getfixturevalue("pg_server") if name == "postgres" else None
        folder = tmp_path / f"store{next(numbers)}"
        folder.mkdir()
        return make_backend(name, folder, server)

    return make


# The fast subset (`pytest -m "not slow"`, README "Set up"): every test but those that
# start a real component (PostgreSQL, a server on 127.0.0.1, node, chromium, a wheel
# build), draw many examples (hypothesis) or measure (benchmarks, the hostile corpora).
# One rule over the collected items, so a new test of those kinds is slow without a mark.
_SLOW_FOLDERS = frozenset({"benchmarks", "hostile"})
_SLOW_FILES = frozenset(
    {
        "test_install.py",
        "test_real_material.py",
        "test_report_browser.py",
        "test_hosts.py",
        "test_server.py",
        "test_server_protocol.py",
        "test_api_properties.py",
        "test_store_postgres.py",
    }
)


def _slow(item: pytest.Item) -> bool:
    path = Path(str(item.fspath))
    callspec = getattr(item, "callspec", None)
    params = callspec.id.split("-") if callspec is not None else []
    postgres = "pg_server" in getattr(item, "fixturenames", ()) or "postgres" in params
    return (
        path.parent.name in _SLOW_FOLDERS
        or path.name in _SLOW_FILES
        or postgres
        or bool(getattr(getattr(item, "obj", None), "is_hypothesis_test", False))
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _slow(item) and item.get_closest_marker("slow") is None:
            item.add_marker(pytest.mark.slow)
