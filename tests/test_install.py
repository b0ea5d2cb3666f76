"""The installed distribution adds one top-level name, ``lamina``: the repository's
``pipeline/``, ``processors/`` and ``renderers/`` folders install as ``lamina.pipeline``,
``lamina.processors`` and ``lamina.renderers``, so a host's own ``pipeline`` module (or
django-pipeline's) is never shadowed, and a script beside a clone named ``lamina`` imports
the package rather than the folder."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel ``pip install .`` would install, built offline from this checkout."""
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(out),
            str(ROOT),
        ],
        check=True,
        timeout=240,
        capture_output=True,
    )
    (built,) = out.glob("lamina-*.whl")
    return built


def test_the_wheel_holds_only_the_lamina_package(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    tops = {name.split("/")[0] for name in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"lamina"}
    assert "lamina/pipeline/_budget/__init__.py" in names
    assert "lamina/processors/py.typed" in names
    assert "lamina/renderers/py.typed" in names
    assert any(n.startswith("lamina/pipeline/_tokens/encodings/") for n in names)
    assert "lamina/_demo/vault/project-spec.md" in names


def test_the_installed_distribution_declares_one_top_level_name() -> None:
    top = importlib.metadata.distribution("lamina").read_text("top_level.txt")
    assert top is not None
    assert top.split() == ["lamina"]


def test_a_host_module_named_pipeline_is_not_shadowed(tmp_path: Path) -> None:
    for name in ("pipeline", "processors", "renderers"):
        (tmp_path / f"{name}.py").write_text(f"OWN = {name!r}\n", encoding="utf-8")
    (tmp_path / "host.py").write_text(
        "import pipeline, processors, renderers\n"
        "from lamina import Budget, Conversation\n"
        "print(pipeline.OWN, processors.OWN, renderers.OWN, Budget.__name__)\n",
        encoding="utf-8",
    )
    done = subprocess.run(
        [sys.executable, "host.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["pipeline", "processors", "renderers", "Budget"]


def test_a_script_beside_a_clone_named_lamina_imports_the_installed_package(
    wheel: Path, tmp_path: Path
) -> None:
    """The folder of a clone named ``lamina`` has no ``__init__.py``; an installed package
    (here the wheel, unpacked onto the path) wins over that namespace folder."""
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    work = tmp_path / "work"
    (work / "lamina").mkdir(parents=True)
    (work / "lamina" / "README.md").write_text("a clone\n", encoding="utf-8")
    (work / "script.py").write_text(
        "import lamina\nfrom lamina import Budget\nprint(lamina.__file__)\n",
        encoding="utf-8",
    )
    done = subprocess.run(
        [sys.executable, "script.py"],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(site / "lamina" / "__init__.py")
