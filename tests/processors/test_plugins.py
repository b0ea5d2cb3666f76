"""Third-party processors: real discovery through installed package metadata.

Each test "installs" the example plugin (examples/plugin_csv) the way pip would leave
it: the package source plus a ``*.dist-info`` folder with METADATA and entry_points.txt,
in a folder put on sys.path (or PYTHONPATH for the CLI).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping
from importlib.metadata import distribution
from pathlib import Path
from typing import Any

import pytest

from lamina import Conversation, renderer_for
from lamina.pipeline import Form, View, check_envelope
from lamina.pipeline.errors import AttachmentError, PathOutsideVault, RegistryError
from lamina.pipeline.sources import Processed
from lamina.processors import (
    BaseProcessor,
    ProcessContext,
    Registry,
    Sources,
    Vault,
    note,
    reload_plugins,
)
from tests.cli import lamina

ROOT = Path(__file__).resolve().parents[2]
PLUGIN_SOURCE = ROOT / "examples" / "plugin_csv" / "lamina_csv"
PLUGIN_MODULES = ("lamina_csv", "lamina_broken_factory", "lamina_dupnote")

CSV = "city,population,note\nOslo,709000,capital\nBergen,291000,a<b & c\nTromsø,77000,far | north\n"


def install(site: Path, name: str, entry_points: Mapping[str, str]) -> None:
    """Write ``<name>-0.1.dist-info`` declaring ``lamina.processors`` entry points."""
    info = site / f"{name}-0.1.dist-info"
    info.mkdir(parents=True)
    info.joinpath("METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n", encoding="utf-8"
    )
    lines = "".join(f"{ep} = {target}\n" for ep, target in entry_points.items())
    info.joinpath("entry_points.txt").write_text(f"[lamina.processors]\n{lines}", encoding="utf-8")


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A site folder on sys.path holding the example plugin, installed from its source."""
    folder = tmp_path / "site"
    shutil.copytree(
        PLUGIN_SOURCE, folder / "lamina_csv", ignore=shutil.ignore_patterns("__pycache__")
    )
    install(folder, "lamina_csv", {"csv": "lamina_csv:CsvProcessor"})
    monkeypatch.syspath_prepend(str(folder))
    reload_plugins()  # installed now: the next Registry.default() scans again
    yield folder
    for name in PLUGIN_MODULES:
        sys.modules.pop(name, None)
    reload_plugins()


@pytest.fixture
def broken(site: Path) -> Path:
    """Three more installed plugins: a missing module, a raising factory, a duplicate kind."""
    install(site, "lamina_missing", {"ghost": "lamina_not_installed:Processor"})
    site.joinpath("lamina_broken_factory.py").write_text(
        "def make():\n    raise RuntimeError('no licence key configured')\n", encoding="utf-8"
    )
    install(site, "lamina_broken_factory", {"licensed": "lamina_broken_factory:make"})
    site.joinpath("lamina_dupnote.py").write_text(
        "class NoteAgain:\n"
        "    kind = 'note'\n"
        "    def parse(self, data):\n        raise NotImplementedError\n"
        "    def process(self, spec, ctx):\n        raise NotImplementedError\n",
        encoding="utf-8",
    )
    install(site, "lamina_dupnote", {"notes2": "lamina_dupnote:NoteAgain"})
    return site


@pytest.fixture
def csv_vault(vault: Path) -> Path:
    (vault / "data").mkdir()
    (vault / "data" / "cities.csv").write_text(CSV, encoding="utf-8")
    return vault


# --- discovery ---------------------------------------------------------------


def test_the_installed_plugin_is_found_through_its_metadata(site: Path) -> None:
    assert [ep.name for ep in distribution("lamina_csv").entry_points] == ["csv"]
    registry = Registry.default()
    assert "csv" in registry
    assert type(registry.get("csv")).__module__ == "lamina_csv"
    assert registry.plugin_errors == []


def test_without_the_plugin_installed_csv_is_unknown() -> None:
    assert "csv" not in Registry.default()


def test_the_plugin_kind_parses_its_script_form(site: Path) -> None:
    spec = Registry.default().parse({"csv": "data/cities.csv", "rows": 2})
    assert (spec.kind, spec.describe()) == ("csv", "csv data/cities.csv (first 2 rows)")


# --- a conversation ----------------------------------------------------------


def test_the_plugin_works_across_a_three_turn_conversation(site: Path, csv_vault: Path) -> None:
    from lamina_csv import csv_file

    conv = Conversation("You are helpful.", vault=csv_vault)
    t1 = conv.turn("What is in the table?", attach=[{"csv": "data/cities.csv"}])
    [segment] = t1.l3.segments
    assert (segment.key, segment.form, segment.source_type) == (
        "csv:data/cities.csv",
        Form.FULL,
        "csv",
    )
    # The plugin's renderer: CDATA keeps "a<b & c" verbatim; the default would escape it.
    assert segment.text.startswith('<csv key="csv:data/cities.csv" title="cities"')
    assert 'path="data/cities.csv" rows="3"><![CDATA[\n| city | population | note |' in segment.text
    assert "| Bergen | 291000 | a<b & c |" in segment.text
    assert "| Tromsø | 77000 | far \\| north |" in segment.text
    conv.reply("Three Norwegian cities.")

    t2 = conv.turn("And the spec?", attach=[csv_file("data/cities.csv"), note("project-spec.md")])
    assert t2.l2.keys() == ("csv:data/cities.csv",)
    assert [(s.key, s.form) for s in t2.l3.segments] == [
        ("csv:data/cities.csv", Form.REFERENCE),
        ("note:project-spec.md", Form.FULL),
    ]
    [promoted] = t2.l2.segments
    assert promoted.form is Form.FULL
    assert "<![CDATA[" in promoted.text and promoted.text in t2.system_text
    conv.reply("The spec covers sync.")

    t3 = conv.turn("Which city is northmost?", attach=[{"csv": "data/cities.csv"}])
    assert t3.l2.keys() == ("csv:data/cities.csv", "note:project-spec.md")
    assert [(s.key, s.form) for s in t3.l3.segments] == [("csv:data/cities.csv", Form.REFERENCE)]
    assert t3.system_text.startswith(t2.system_text)
    for prev, env in ((None, t1), (t1, t2), (t2, t3)):
        check_envelope(env, prev)


def test_the_conversation_is_byte_identical_when_repeated(site: Path, csv_vault: Path) -> None:
    def run() -> list[str]:
        conv = Conversation("s", vault=csv_vault)
        texts = []
        for query in ("one", "two"):
            env = conv.turn(query, attach=[{"csv": "data/cities.csv", "rows": 2}])
            texts.append(env.system_text + "\n" + env.user_text)
            conv.reply("ok")
        return texts

    assert run() == run()


# --- renderers ---------------------------------------------------------------


def _view(form: Form, body: str) -> View:
    return View(
        key="csv:t.csv",
        source_type="csv",
        form=form,
        title="t",
        locator="t.csv",
        recoverable=True,
        content_hash="0",
        attributes=(("path", "t.csv"), ("rows", "1")),
        body=body,
    )


def test_the_registry_renderer_uses_plugin_renderers_only_for_their_form(site: Path) -> None:
    renderer = renderer_for(Sources(registry=Registry.default()))
    assert "<![CDATA[" in renderer.render(_view(Form.FULL, "| a<b |"))
    assert renderer.render(_view(Form.PREVIEW, "| a<b |")).endswith(
        'form="preview">\n| a<b |\n</csv>'
    )


def test_a_body_that_would_close_the_cdata_falls_back_to_escaped_text(site: Path) -> None:
    renderer = renderer_for(Sources(registry=Registry.default()))
    text = renderer.render(_view(Form.FULL, "| x]]><y/> |"))
    assert "CDATA" not in text
    assert "\n| x]]><y/> |\n" in text
    closing = renderer.render(_view(Form.FULL, "| </csv> |"))
    assert "CDATA" not in closing and "| &lt;/csv> |" in closing


class _Fake(BaseProcessor):
    def __init__(self, kind: str, renderers: Any = None) -> None:
        self._kind = kind
        if renderers is not None:
            self.renderers = renderers

    @property
    def kind(self) -> str:
        return self._kind

    def parse(self, data: Mapping[str, Any]) -> Any:
        raise NotImplementedError

    def script_form(self, spec: Any) -> dict[str, Any]:
        raise NotImplementedError

    def process(self, spec: Any, ctx: ProcessContext) -> Processed:
        raise NotImplementedError


def test_a_duplicate_plugin_renderer_is_refused_by_name() -> None:
    registry = Registry([_Fake("a", {("csv", "full"): str})])
    with pytest.raises(RegistryError, match="already registered for csv/full") as info:
        registry.register(_Fake("b", {("csv", "full"): str}))
    assert info.value.kind == "b"
    assert "b" not in registry


@pytest.mark.parametrize(
    ("renderers", "problem"),
    [
        ([("csv", "full")], "must be a mapping"),
        ({"csv": str}, "is not (source_type, form)"),
        ({("csv", "tiny"): str}, "form 'tiny' is not one of full, preview"),
        ({("csv", "full"): "not callable"}, "is not callable"),
    ],
)
def test_malformed_plugin_renderers_are_refused(renderers: Any, problem: str) -> None:
    with pytest.raises(RegistryError, match=problem.replace("(", r"\(").replace(")", r"\)")):
        Registry([_Fake("a", renderers)])


# --- broken plugins ----------------------------------------------------------


def test_broken_plugins_are_reported_by_name_and_the_good_one_loads(broken: Path) -> None:
    registry = Registry.default()
    assert "csv" in registry
    assert type(registry.get("note")).__module__ == "lamina.processors._notes"
    errors = {e.plugin: str(e) for e in registry.plugin_errors}
    assert sorted(errors) == ["ghost", "licensed", "notes2"]
    assert "ModuleNotFoundError: No module named 'lamina_not_installed'" in errors["ghost"]
    assert "RuntimeError: no licence key configured" in errors["licensed"]
    assert "'note': a processor for this kind is already registered" in errors["notes2"]
    for plugin, dist in (("ghost", "lamina_missing"), ("notes2", "lamina_dupnote")):
        assert f"(from {dist} 0.1)" in errors[plugin]


# --- the example plugin itself -------------------------------------------------


def _process(site: Path, vault: Path, data: Mapping[str, Any]) -> Processed:
    sources = Sources(registry=Registry.default(), context=ProcessContext(vault=Vault(vault)))
    return sources.process(sources.parse(data))


def test_rows_limits_the_table_and_says_how_many_were_left_out(site: Path, csv_vault: Path) -> None:
    [artifact] = _process(site, csv_vault, {"csv": "data/cities.csv", "rows": 1}).artifacts
    body = artifact.payload.body()
    assert body.splitlines()[2:] == [
        "| Oslo | 709000 | capital |",
        "",
        "[Showing the first 1 of 3 rows; attach with a larger rows value to see more.]",
    ]
    assert artifact.payload.attributes() == (("path", "data/cities.csv"), ("rows", "3"))
    assert artifact.recoverable


def test_a_csv_outside_the_vault_is_refused(site: Path, csv_vault: Path) -> None:
    (csv_vault.parent / "secret.csv").write_text("a\n1\n", encoding="utf-8")
    with pytest.raises(PathOutsideVault):
        _process(site, csv_vault, {"csv": "../secret.csv"})


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        ({"csv": "data/missing.csv"}, "no such file"),
        ({"csv": "data"}, "is a directory"),
        ({"csv": "data/cities.csv", "rows": 0}, "rows must be a positive integer"),
        ({"csv": "data/cities.csv", "cols": 2}, "unknown fields: cols"),
    ],
)
def test_bad_csv_attachments_raise_typed_errors(
    site: Path, csv_vault: Path, data: dict[str, Any], problem: str
) -> None:
    with pytest.raises(AttachmentError, match=problem):
        _process(site, csv_vault, data)


# --- the CLI -----------------------------------------------------------------


def _lamina(site: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return lamina(*args, cwd=site.parent, env={"PYTHONPATH": str(site)})


def _script(tmp_path: Path, vault: Path) -> Path:
    path = tmp_path / "chat.json"
    turns = [
        {"user": "Read it", "attach": [{"csv": "data/cities.csv", "rows": 2}], "reply": "ok"},
        {"user": "Again", "attach": [{"csv": "data/cities.csv", "rows": 2}]},
    ]
    path.write_text(json.dumps({"vault": str(vault), "turns": turns}), encoding="utf-8")
    return path


def test_the_cli_runs_a_script_with_the_plugin_kind(
    site: Path, csv_vault: Path, tmp_path: Path
) -> None:
    result = _lamina(site, "run", str(_script(tmp_path, csv_vault)), "--json")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    trace = json.loads(result.stdout)
    text = json.dumps(trace, ensure_ascii=False)
    assert "<![CDATA[\\n| city | population | note |" in text
    assert '<reference key=\\"csv:data/cities.csv\\" source=\\"csv\\"' in text


def test_the_cli_warns_about_broken_plugins_and_carries_on(
    broken: Path, csv_vault: Path, tmp_path: Path
) -> None:
    result = _lamina(broken, "run", str(_script(tmp_path, csv_vault)), "--json")
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    assert [line.split("'")[1] for line in lines] == ["ghost", "licensed", "notes2"]
    assert all(line.startswith("lamina: warning: '") for line in lines)
    assert "csv:data/cities.csv" in result.stdout


# --- a plugin kind persists like a built-in one --------------------------------------


def test_a_plugin_kind_saves_resumes_exports_and_imports(
    site: Path, csv_vault: Path, tmp_path: Path
) -> None:
    from lamina_csv import csv_file

    from lamina import export_transcript, import_transcript, load_conversation, rebuild_envelope
    from lamina.pipeline.store import ConversationInfo, SqliteStore, save_turn

    with SqliteStore(tmp_path / "a.sqlite") as store:
        store.create(ConversationInfo("c", "2026-01-01T00:00:00Z", "gpt-4o"))
        conv = Conversation("You are helpful.", vault=csv_vault)
        first = [csv_file("data/cities.csv", rows=2)]
        env1 = conv.turn("What is in the table?", attach=first)
        conv.reply("Cities.")
        saved = save_turn(store, "c", conv, env1, first, created="T1", reply_created="R1")
        second = [note("project-spec.md"), {"csv": "data/cities.csv"}]
        env2 = conv.turn("All rows and the spec?", attach=second)
        save_turn(store, "c", conv, env2, second, created="T2")
        [record] = saved.attachments
        assert (record.kind, record.label) == ("csv", "data/cities.csv#rows=2")
        assert record.rebuilt
        assert record.data() == {"csv": "data/cities.csv", "rows": 2}

        # Resume: both turns replay to their saved manifests, and the chat goes on.
        assert rebuild_envelope(store, "c", 1, vault=csv_vault) is not None
        previous = rebuild_envelope(store, "c", vault=csv_vault)
        assert previous is not None and previous.system_text == env2.system_text
        resumed = load_conversation(store, "c", vault=csv_vault)
        again = resumed.turn("And again?", attach=[csv_file("data/cities.csv", rows=2)])
        assert again.l2.keys()[0] == "csv:data/cities.csv"

        text = export_transcript(store, "c")
        state = store.load("c")
    assert "[Context: CSV files: data/cities.csv#rows=2]" in text
    assert "[Context: Notes: project-spec.md | CSV files: data/cities.csv]" in text

    with SqliteStore(tmp_path / "b.sqlite") as other:
        report = import_transcript(text, other, vault=csv_vault)
        assert report.problems == ()
        assert report.rebuilt == (
            "csv data/cities.csv#rows=2",
            "note project-spec.md",
            "csv data/cities.csv",
        )
        assert export_transcript(other, "c") == text
        assert other.load("c") == state


def test_a_plugin_without_a_required_hook_is_refused_naming_it() -> None:
    class NoForm:
        kind = "nf"
        category = ""
        renderers: Mapping[Any, Any] = {}
        settings = None

        def parse(self, data: Mapping[str, Any]) -> Any:
            raise NotImplementedError

        def process(self, spec: Any, ctx: ProcessContext) -> Processed:
            raise NotImplementedError

    with pytest.raises(RegistryError, match=r"NoForm has no script_form\(\) hook") as info:
        Registry([NoForm()])  # type: ignore[list-item]
    assert info.value.kind == "nf"


def test_a_hook_with_the_wrong_arguments_is_refused() -> None:
    class BadLabel(_Fake):
        def label(self) -> str:  # type: ignore[override]
            return ""

    with pytest.raises(RegistryError, match=r"BadLabel.label\(\) must take \(form\)"):
        Registry([BadLabel("bl")])


def test_an_installed_broken_hook_is_a_plugin_error(site: Path) -> None:
    site.joinpath("lamina_nohooks.py").write_text(
        "class Old:\n"
        "    kind = 'old'\n"
        "    def parse(self, data):\n        raise NotImplementedError\n"
        "    def process(self, spec, ctx):\n        raise NotImplementedError\n",
        encoding="utf-8",
    )
    install(site, "lamina_nohooks", {"old": "lamina_nohooks:Old"})
    try:
        registry = Registry.default(refresh=True)
    finally:
        sys.modules.pop("lamina_nohooks", None)
    assert "csv" in registry and "old" not in registry
    [error] = registry.plugin_errors
    assert error.plugin == "old"
    assert "lamina_nohooks.Old has no script_form() hook" in str(error)


# --- discovery once per process ----------------------------------------------------


def test_plugins_are_scanned_once_per_process_and_again_on_request(
    site: Path, csv_vault: Path
) -> None:
    from lamina.processors import plugin_scans

    Conversation("s", vault=csv_vault)
    scans = plugin_scans()
    second = Conversation("s", vault=csv_vault)
    Conversation.restore(second.state, vault=csv_vault)
    assert plugin_scans() == scans
    assert "csv" in Registry.default()
    assert plugin_scans() == scans
    Registry.default(refresh=True)
    assert plugin_scans() == scans + 1
    reload_plugins()
    Conversation("s", vault=csv_vault)
    assert plugin_scans() == scans + 2


def test_a_default_registry_is_a_copy_a_host_may_extend_alone() -> None:
    first = Registry.default()
    first.register(_Fake("extra", {("extra", "full"): str}))
    second = Registry.default()
    assert "extra" in first and "extra" not in second
    assert second.kinds() == tuple(k for k in first.kinds() if k != "extra")
    assert ("extra", Form.FULL) not in second.view_renderers()
    # The built-ins are checked once per process and shared, not rebuilt per registry.
    assert second.get("note") is first.get("note")


def test_a_plugin_record_saved_before_kinds_owned_their_form_still_loads(
    site: Path, csv_vault: Path, tmp_path: Path
) -> None:
    """Stores written before: a plugin attachment kept with no script form."""
    from lamina import export_transcript, load_conversation, rebuild_envelope
    from lamina.pipeline.store import AttachmentRecord, ConversationInfo, SqliteStore, save_turn

    with SqliteStore(tmp_path / "old.sqlite") as store:
        store.create(ConversationInfo("old", "2026-01-01T00:00:00Z"))
        conv = Conversation("s", vault=csv_vault)
        env = conv.turn("Read it", attach=[{"csv": "data/cities.csv"}])
        old = AttachmentRecord("csv", "data/cities.csv (first 200 rows)", "", True)
        save_turn(store, "old", conv, env, [old], created="T1")
        assert rebuild_envelope(store, "old", vault=csv_vault) is None  # nothing to replay
        assert load_conversation(store, "old", vault=csv_vault).state == conv.state
        assert "[Context: CSV files: data/cities.csv (first 200 rows)]" in export_transcript(
            store, "old"
        )
