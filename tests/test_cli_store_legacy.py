"""``lamina report --store``, ``lamina export`` and ``lamina resume`` on stores older
Lamina versions wrote (chat30 at 6,000 tokens, saved by three commits from before
decisions were typed), as they are (read-only, unchanged) and after ``lamina migrate``,
on SQLite and PostgreSQL. Before, the report stopped at turn 1 (``cannot be rebuilt as
it was sent``): no stored report equals this version's, and five turns' layers this
version's budget builds otherwise; and resume's first new turn said "First request of the
chat" (its previous request was not replayed identically)."""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import pytest

import lamina
from lamina.pipeline._hashing import text_hash
from lamina.pipeline._store.records import BATCH_NOT_REBUILT, canonical, digest
from lamina.pipeline.store import ConversationInfo, open_store, save_turn
from tests.cli import ROOT, lamina_here
from tests.cli import lamina as lamina_cli
from tests.stores import COMMITS, Backend, legacy_store

VAULT = str(ROOT / "examples" / "vault")
# And a store written after decisions were typed whose turns 11 and 23 re-sent the spec
# in full beside its library entry, marked with the entry's form: this version's budget
# sends it otherwise, so those blocks are rendered as that stage rendered them.
REPORTED = (*COMMITS, "87f7834")


def _report(backend: Backend, cid: str, page: Path) -> str:
    ran = lamina_here(
        "report", "--store", backend.value, "--conversation", cid, "--out", str(page),
        "--vault", VAULT,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == f"report: {page.resolve()} (30 turns)\n"
    return page.read_text(encoding="utf-8")


@pytest.mark.parametrize("commit", REPORTED)
def test_report_and_export_read_an_old_store_as_it_is_and_after_migrating(
    backend: Backend, commit: str, tmp_path: Path
) -> None:
    cid = legacy_store(commit, backend)
    before = backend.dump()
    page = _report(backend, cid, tmp_path / "report.html")
    assert "turn 30" in page and "resent" in page  # the decisions with their actions
    exported = lamina_here("export", backend.value, "--conversation", cid)
    assert exported.returncode == 0, exported.stderr
    assert exported.stdout.count("\n**user**: Turn ") == 30
    assert backend.dump() == before
    migrated = lamina_here("migrate", backend.value)
    assert migrated.returncode == 0, migrated.stderr
    assert migrated.stdout.endswith("schema version 3 (was 2)\n")
    assert _report(backend, cid, tmp_path / "after.html") == page


@pytest.mark.parametrize("commit", ["a7b9f6f", "87f7834"])
def test_each_old_turn_is_told_with_the_layers_it_was_sent_with(
    backend: Backend, commit: str
) -> None:
    """Every turn's five layers hash to its stored manifest's (of a7b9f6f's, 25 replay
    so; turns 9, 11, 14, 23 and 29 are made of the texts earlier turns and the stored
    library hold), and carry the stored report; a layer whose stored hash is not matched
    is not told."""
    cid = legacy_store(commit, backend)
    with open_store(backend.value, read_only=True) as store:
        envelopes = lamina.rebuild_envelopes(store, cid, vault=VAULT)
        assert len(envelopes) == 30
        for k, envelope in enumerate(envelopes, 1):
            manifest = store.manifest(cid, k)
            assert envelope is not None and manifest is not None
            assert [layer.hash for layer in envelope.layers] == [
                layer.hash for layer in manifest.layers
            ]
            assert [text_hash(layer.text) for layer in envelope.layers] == [
                layer.hash for layer in manifest.layers
            ]
            assert envelope.report == manifest.report
    (h,) = backend.rows("SELECT manifest_hash FROM turns WHERE turn = 23")[0]
    (body,) = backend.rows("SELECT body FROM snapshots WHERE hash = ?", (h,))[0]
    plain = json.loads(zlib.decompress(bytes(body)))
    plain["layers"][2]["hash"] = "0" * 32  # L3 as it was not sent
    changed = canonical(plain)
    backend.execute(
        "INSERT INTO snapshots VALUES (?, ?, ?)",
        (digest(changed), "manifest", zlib.compress(changed, 6)),
    )
    backend.execute("UPDATE turns SET manifest_hash = ? WHERE turn = 23", (digest(changed),))
    with open_store(backend.value, read_only=True) as store:
        told = lamina.rebuild_envelopes(store, cid, vault=VAULT)
    assert [k for k, e in enumerate(told, 1) if e is None] == [23]


def test_a_turn_batched_otherwise_is_told_as_built_and_says_so(
    backend: Backend, vault: Path
) -> None:
    """A turn sent as a deferred request this Lamina batches otherwise (its stored batch
    hash is not the replay's: a store of an older Lamina) is told as built, its layers as
    stored, with a ``batch-not-rebuilt`` warning; the other turns are the replays."""
    with backend.open() as store:
        store.create(ConversationInfo("c", vault=str(vault)))
        conv = lamina.Conversation("Be terse.", vault=vault, defer_library=True)
        for i in range(1, 4):
            attach = [{"note": "project-spec.md"}] if i == 1 else [{"selection": f"s{i}"}]
            env = conv.turn(f"question {i}", attach)
            save_turn(store, "c", conv, env, attach)
            conv.reply(f"answer {i}")
            save_turn(store, "c", conv, env, attach)
        replays = [lamina.rebuild_envelope(store, "c", k, vault=vault) for k in (1, 2, 3)]
    assert all(e is not None and e.batch is not None for e in replays[1:])
    (h,) = backend.rows("SELECT manifest_hash FROM turns WHERE turn = 2")[0]
    (body,) = backend.rows("SELECT body FROM snapshots WHERE hash = ?", (h,))[0]
    plain = json.loads(zlib.decompress(bytes(body)))
    plain["batch_hash"] = "0" * 32
    changed = canonical(plain)
    backend.execute(
        "INSERT INTO snapshots VALUES (?, ?, ?)",
        (digest(changed), "manifest", zlib.compress(changed, 6)),
    )
    backend.execute("UPDATE turns SET manifest_hash = ? WHERE turn = 2", (digest(changed),))
    with open_store(backend.value, read_only=True) as store:
        told = lamina.rebuild_envelopes(store, "c", vault=vault)
    assert told[0] == replays[0] and told[2] == replays[2]
    second, replay = told[1], replays[1]
    assert second is not None and replay is not None
    assert second.batch is None and second.layers == replay.layers
    assert second.report.warnings == (*replay.report.warnings, BATCH_NOT_REBUILT)


# The first turn resume adds, compared with turn 30 as it was sent (the same figures as
# the hub's, below); a7b9f6f's and the two before it send turn 30 alike.
_SAME = (
    "cached prefix: 2948 of 3025 tokens repeat the previous turn's request (97%, predicted)",
)
RESUMED = {
    "04fd623": _SAME,
    "4f04b07": _SAME,
    "a7b9f6f": _SAME,
    # The cascade that wrote 87f7834 would restore project-spec.md here (161 of 4,142
    # cached); the objective keeps its summary, which is worth less than the prefix.
    "87f7834": (
        "cached prefix: 2738 of 2815 tokens repeat the previous turn's request (97%, predicted)",
    ),
}


def _resume(backend: Backend, cid: str, folder: Path) -> list[str]:
    """``lamina resume`` of one more turn, in a subprocess; its cache lines."""
    script = folder / "more.yaml"
    script.write_text('turns:\n  - user: "Turn 31: and the spec?"\n', encoding="utf-8")
    ran = lamina_cli(
        "resume", backend.value, "--conversation", cid, "--script", str(script),
        "--vault", VAULT, "--messages", "none",
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    return [
        line for line in ran.stdout.splitlines() if line.startswith(("cached prefix", "  why:"))
    ]


@pytest.mark.parametrize("commit", REPORTED)
def test_resume_compares_the_first_new_turn_with_the_last_request_as_it_was_sent(
    backend: Backend, commit: str, tmp_path: Path
) -> None:
    """Turn 30 is told from its stored manifest (no old turn replays identically), so
    turn 31's cached prefix is what it repeats of that request, not "First request"."""
    cid = legacy_store(commit, backend)
    assert _resume(backend, cid, tmp_path) == list(RESUMED[commit])


def _damage_layer(backend: Backend, turn: int) -> None:
    """Turn ``turn``'s stored L3 hash as no text hashes: that layer cannot be told."""
    (h,) = backend.rows("SELECT manifest_hash FROM turns WHERE turn = ?", (turn,))[0]
    (body,) = backend.rows("SELECT body FROM snapshots WHERE hash = ?", (h,))[0]
    plain = json.loads(zlib.decompress(bytes(body)))
    plain["layers"][2]["hash"] = "0" * 32
    changed = canonical(plain)
    backend.execute(
        "INSERT INTO snapshots VALUES (?, ?, ?)",
        (digest(changed), "manifest", zlib.compress(changed, 6)),
    )
    backend.execute("UPDATE turns SET manifest_hash = ? WHERE turn = ?", (digest(changed), turn))


def test_resume_says_so_when_the_previous_request_cannot_be_rebuilt(
    backend: Backend, tmp_path: Path
) -> None:
    cid = legacy_store("a7b9f6f", backend)
    _damage_layer(backend, 30)
    assert _resume(backend, cid, tmp_path) == [
        "cached prefix: 0 of 3025 tokens repeat the previous turn's request (0%, predicted)",
        "  why: The previous request (turn 30) could not be rebuilt as it was sent (a source "
        "changed since, or it was saved in a form this Lamina does not rebuild), so what it "
        "left cached is not known: this request is counted as uncached.",
    ]
