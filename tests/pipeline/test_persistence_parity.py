"""After a save and a reload in a fresh process, later turns are byte-identical."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lamina import Conversation, load_conversation, parse_script, run_saved, run_script
from lamina.pipeline.store import ConversationInfo
from lamina.processors import ProcessContext, Sources, Vault
from lamina.renderers import annotate_trace, trace_document
from tests.cli import lamina
from tests.stores import BACKENDS, Backend, make_backend
from tests.strategies import conversations, localize, serve_site, write_property_vault


@pytest.fixture(scope="module")
def site_vault(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    root = write_property_vault(tmp_path_factory.mktemp("vault"))
    with serve_site(root / "site") as base:
        yield root, base


def _sources(vault: Path) -> Sources:
    return Sources(context=ProcessContext(vault=Vault(vault), allow_private_network=True))


def _turns(script: dict[str, Any], vault: Path) -> list[str]:
    """Each turn of the uninterrupted run's JSON trace (as ``lamina run --json`` writes it)."""
    parsed = parse_script(script)
    conv = Conversation(parsed.system, sources=_sources(vault))
    envelopes = run_script(parsed, conv)
    document = annotate_trace(trace_document(envelopes, conv.counter), envelopes, conv.counter)
    return [json.dumps(t) for t in document["turns"]]


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(chat=conversations, data=st.data())
@pytest.mark.parametrize("backend_name", BACKENDS)
def test_reload_in_a_fresh_process_gives_identical_traces(
    chat: dict[str, Any],
    data: st.DataObject,
    site_vault: tuple[Path, str],
    tmp_path_factory: pytest.TempPathFactory,
    backend_name: str,
    request: pytest.FixtureRequest,
) -> None:
    prop_vault, base = site_vault
    chat = localize(chat, base)
    k = data.draw(st.integers(1, len(chat["turns"]) - 1), label="save after turn")
    expected = _turns(chat, prop_vault)
    work = tmp_path_factory.mktemp("parity")
    server = request.getfixturevalue("pg_server") if backend_name == "postgres" else None
    backend = make_backend(backend_name, work, server)
    first = parse_script({"system": chat["system"], "turns": chat["turns"][:k]})
    with backend.open() as store:
        store.create(ConversationInfo("p"))
        conv = Conversation(first.system, sources=_sources(prop_vault))
        run_saved(first, conv, store, "p")
    rest = work / "rest.json"
    rest.write_text(json.dumps({"turns": chat["turns"][k:]}), encoding="utf-8")
    out = lamina(
        "resume", backend.value, "--conversation", "p", "--script", str(rest),
        "--vault", str(prop_vault), "--json", "--allow-private-network",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    trace = json.loads(out.stdout)
    assert trace["conversation_id"] == "p"
    assert [json.dumps(t) for t in trace["turns"]] == expected[k:]


@pytest.mark.parametrize("budget", [(), ("--window", "1200", "--reserve", "200")])
def test_cli_run_then_resume_equals_one_run(
    tmp_path: Path, vault: Path, budget: tuple[str, ...], backend: Backend
) -> None:
    turns = [
        {"user": "Summarize", "attach": [{"note": "project-spec.md"}], "reply": "A spec."},
        {"user": "API?", "attach": [{"note": "docs/api-docs.md"}, {"selection": "picked"}]},
        {"user": "Auth?", "attach": [{"note": "docs/auth.md"}], "reply": "Tokens."},
        {"user": "Again", "attach": [{"note": "project-spec.md"}]},
    ]
    for name, part in (("all", turns), ("head", turns[:2]), ("tail", turns[2:])):
        body = {"system": "Be terse.", "turns": part} if name != "tail" else {"turns": part}
        (tmp_path / f"{name}.json").write_text(json.dumps(body), encoding="utf-8")
    whole = lamina("run", str(tmp_path / "all.json"), "--vault", str(vault), "--json", *budget)
    assert whole.returncode == 0, whole.stderr
    head = lamina(
        "run", str(tmp_path / "head.json"), "--vault", str(vault), "--json",
        "--store", backend.value, *budget,
    )  # fmt: skip
    assert head.returncode == 0, head.stderr
    cid = json.loads(head.stdout)["conversation_id"]
    assert len(cid) == 32
    # No --vault: resume finds the vault recorded in the store.
    tail = lamina(
        "resume", backend.value, "--conversation", cid,
        "--script", str(tmp_path / "tail.json"), "--json", *budget,
    )  # fmt: skip
    assert tail.returncode == 0, tail.stderr
    joined = json.loads(head.stdout)["turns"] + json.loads(tail.stdout)["turns"]
    assert [t["turn"] for t in joined] == [1, 2, 3, 4]
    assert json.dumps(joined) == json.dumps(json.loads(whole.stdout)["turns"])


def test_loading_an_earlier_turn_forks_identically(backend: Backend, vault: Path) -> None:
    """Loading the state after turn 1 and running turn 2 again matches the original turn 2."""
    script = parse_script(
        {
            "turns": [
                {"user": "one", "attach": [{"note": "project-spec.md"}], "reply": "ok"},
                {"user": "two", "attach": [{"note": "docs/auth.md"}]},
            ]
        }
    )
    with backend.open() as store:
        store.create(ConversationInfo("f"))
        conv = Conversation(script.system, vault=vault)
        original = run_saved(script, conv, store, "f")[1]
        fork = load_conversation(store, "f", turn=1, vault=vault)
    assert fork.turn("two", [{"note": "docs/auth.md"}]) == original


def test_run_with_existing_conversation_id_is_refused(tmp_path: Path, vault: Path) -> None:
    (tmp_path / "a.json").write_text(json.dumps({"turns": [{"user": "hi"}]}), encoding="utf-8")
    args = (
        "run",
        str(tmp_path / "a.json"),
        "--vault",
        str(vault),
        "--store",
        str(tmp_path / "s.db"),
    )
    assert lamina(*args, "--conversation", "x").returncode == 0
    again = lamina(*args, "--conversation", "x")
    assert again.returncode == 2
    assert again.stderr.strip().endswith("conversation 'x' already exists")
