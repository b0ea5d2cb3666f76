"""Stage ordering, validation at build time, and a host-inserted stage."""

from __future__ import annotations

import re
from pathlib import Path

import attrs
import pytest

from lamina import Conversation
from lamina.pipeline import Pipeline, TurnGraph
from lamina.pipeline.errors import PipelineError, StageError
from lamina.pipeline.stages import Dedup, Expand, Promote, Reference
from lamina.processors import folder, note, selection


@attrs.frozen
class Named:
    name: str
    after: tuple[str, ...] = ()
    before: tuple[str, ...] = ()

    def __call__(self, turn: TurnGraph) -> TurnGraph:
        return turn


def test_default_order() -> None:
    assert Pipeline.default().names == (
        "expand",
        "dedup",
        "pages",
        "reference",
        "budget",
        "promote",
    )


def test_stages_are_sorted_by_dependencies_not_by_given_order() -> None:
    pipeline = Pipeline([Promote(), Reference(), Dedup(), Expand()])
    assert pipeline.names == ("expand", "dedup", "reference", "promote")


def test_unknown_dependency_names_the_stage() -> None:
    with pytest.raises(
        PipelineError, match=r"stage 'late': runs after unknown stage 'nope'"
    ) as err:
        Pipeline([Expand(), Named("late", after=("nope",))])
    assert err.value.stage == "late"


def test_cycle_is_refused_with_its_path() -> None:
    with pytest.raises(PipelineError, match=r"dependency cycle: .*a.*b"):
        Pipeline([Named("a", after=("b",)), Named("b", after=("a",))])


def test_duplicate_stage_name_is_refused() -> None:
    with pytest.raises(PipelineError, match="two stages have this name"):
        Pipeline([Expand(), Expand()])


def test_before_places_a_host_stage_ahead_of_a_builtin() -> None:
    pipeline = Pipeline.default().with_stage(
        Named("redact", after=("dedup",), before=("reference",))
    )
    assert pipeline.names == (
        "expand",
        "dedup",
        "pages",
        "redact",
        "reference",
        "budget",
        "promote",
    )


def test_a_failing_stage_is_named() -> None:
    @attrs.frozen
    class Boom:
        name: str = "boom"
        after: tuple[str, ...] = ("expand",)

        def __call__(self, turn: TurnGraph) -> TurnGraph:
            raise ZeroDivisionError("nope")

    conv = Conversation(pipeline=Pipeline.default().with_stage(Boom()))
    with pytest.raises(StageError, match=r"stage 'boom' failed: ZeroDivisionError"):
        conv.turn("q", attach=[selection("text")])


_EMAIL = re.compile(r"[\w.+-]+@[\w-]+\.[\w.]+")


@attrs.frozen
class RedactEmails:
    """A host stage: replace e-mail addresses in every attached artifact."""

    name: str = "redact"
    after: tuple[str, ...] = ("dedup",)
    before: tuple[str, ...] = ("reference",)

    def __call__(self, turn: TurnGraph) -> TurnGraph:
        for item in turn.items:
            artifact = turn.artifact(item.key)
            redacted = artifact.payload.replace_text(lambda t: _EMAIL.sub("[email]", t))
            turn = turn.with_artifact(artifact.with_payload(redacted))
        return turn


def test_host_stage_redacts_emails_before_anything_is_rendered(tmp_path: Path) -> None:
    (tmp_path / "contacts.md").write_text("# Contacts\n\nWrite to ana@example.org or bo@lab.io.\n")
    conv = Conversation(vault=tmp_path, pipeline=Pipeline.default().with_stage(RedactEmails()))
    env = conv.turn("who?", attach=[note("contacts.md"), selection("mail me: cy@x.com")])
    text = env.user_text
    assert "@" not in text
    assert text.count("[email]") == 3
    conv.reply("ok")
    env2 = conv.turn("again", attach=[note("contacts.md")])
    assert "@" not in env2.system_text
    assert env2.l3.segments[0].form == "reference"


def test_expand_keeps_folder_order_and_dedup_keeps_first(vault: Path) -> None:
    conv = Conversation(vault=vault)
    env = conv.turn("q", attach=[note("docs/auth.md"), folder("docs"), note("docs/auth.md")])
    assert env.l3.keys() == ("note:docs/auth.md", "note:docs/api-docs.md")
    assert env.report.stat("duplicates_removed") == 2
    assert env.report.stat("attached") == 4


def test_turn_graph_records_provenance(vault: Path) -> None:
    captured: list[TurnGraph] = []

    @attrs.frozen
    class Capture:
        name: str = "capture"
        after: tuple[str, ...] = ("promote",)

        def __call__(self, turn: TurnGraph) -> TurnGraph:
            captured.append(turn)
            return turn

    conv = Conversation(vault=vault, pipeline=Pipeline.default().with_stage(Capture()))
    conv.turn("q", attach=[folder("docs")])
    graph = captured[0].graph
    assert graph.edges["folder:docs", "note:docs/api-docs.md"]["kind"] == "contains"
    assert graph.edges["note:docs/api-docs.md", "note:project-spec.md"]["kind"] == "links"
    assert graph.nodes["note:project-spec.md"]["kind"] == "linked"
    assert graph.edges["note:docs/auth.md", "note:docs/auth.md#full"]["kind"] == "view"
