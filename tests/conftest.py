"""Shared fixtures: a small vault written into tmp_path for each test that asks."""

from __future__ import annotations

from pathlib import Path

import pytest

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


@pytest.fixture
def vault(tmp_path: Path) -> Path:
    """A three-note vault: project-spec.md, docs/api-docs.md, docs/auth.md."""
    return write_vault(
        tmp_path / "vault",
        {"project-spec.md": SPEC, "docs/api-docs.md": API, "docs/auth.md": AUTH},
    )
