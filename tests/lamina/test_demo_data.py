"""The demo's material ships inside the package and is found through importlib.resources."""

from __future__ import annotations

import importlib.resources
import json
import tomllib
from pathlib import Path

from lamina._cli import demo_data
from tests.cli import ROOT, lamina_here


def test_the_demo_data_is_the_packages_own_resource() -> None:
    shipped = importlib.resources.files("lamina") / "_demo"
    with demo_data() as path:
        assert path == Path(str(shipped))
        assert (path / "vault" / "project-spec.md").is_file()
        assert (path / "site" / "offline-sync-faq.html").is_file()


def test_the_repositorys_examples_are_the_shipped_folders_not_copies() -> None:
    with demo_data() as path:
        for name in ("vault", "site"):
            assert (ROOT / "examples" / name).resolve() == (path / name).resolve()


def test_a_built_package_carries_every_demo_file() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert "_demo/**/*" in config["tool"]["setuptools"]["package-data"]["lamina"]


def test_the_demo_runs_from_any_folder(tmp_path: Path) -> None:
    ran = lamina_here("demo", "--json", "--report", str(tmp_path / "r.html"), cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    trace = json.loads(ran.stdout)
    assert len(trace["turns"]) == 6
    assert (tmp_path / "r.html").is_file()
