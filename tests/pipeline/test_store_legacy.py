"""Stores older Lamina versions wrote stay readable, on a real SQLite file and a real
PostgreSQL: the 30-turn chat of ``examples/chat30.yaml`` at a 6,000-token window, saved by
three commits from before decisions were typed (``tests/data/legacy-stores``; see its
README). Their manifests hold decisions without an ``action``: each is told from the rest
of the record (``legacy_action``), its reason kept; an unknown field is still refused."""

from __future__ import annotations

import collections
import json
import zlib
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lamina.pipeline import DecisionAction, DecisionForm
from lamina.pipeline._store.legacy import legacy_action
from lamina.pipeline._store.records import canonical, digest
from lamina.pipeline.errors import StoreUnknownFields
from tests.stores import COMMITS, Backend, legacy_store

A = DecisionAction
def _every_turn(backend: Backend, cid: str, **options: Any) -> collections.Counter[str]:
    """Load every turn's state and manifest; count the manifests' decisions by action."""
    actions: collections.Counter[str] = collections.Counter()
    with backend.open(**options) as store:
        turns = store.turns(cid)
        assert len(turns) == 30
        for record in turns:
            store.load(cid, record.turn)
            manifest = store.manifest(cid, record.turn)
            assert manifest is not None and manifest.turn == record.turn
            actions.update(str(d.action) for d in manifest.report.decisions)
    return actions


# What each of the old chats decided (the same 30 turns under each commit): counted from
# their stored records, with the action each decision's maker gives it today.
EXPECTED = {
    "compacted": 8,  # budget: library entries to a preview or summary
    "evicted": 7,  # budget: library entries to a stub
    "referenced": 3,  # reference: "in library as full"
    "resent": 5,  # reference: "library holds only a summary/reference"
    "pinned": 2,  # reference: "content changed; L2 entry pinned"
}


@pytest.mark.parametrize("commit", COMMITS)
def test_an_old_store_reads_read_only_every_turn_and_stays_as_it_was(
    backend: Backend, commit: str
) -> None:
    """Before: 9 of the 30 manifests (the turns with budget or reference decisions)
    raised StoreCorrupt, read-only or not."""
    cid = legacy_store(commit, backend)
    before = backend.dump()
    with backend.open(read_only=True) as store:
        assert store.schema_version == 2
    assert _every_turn(backend, cid, read_only=True) == EXPECTED
    assert backend.dump() == before


@pytest.mark.parametrize("commit", COMMITS)
def test_an_old_store_reads_every_turn_after_migrating(backend: Backend, commit: str) -> None:
    cid = legacy_store(commit, backend)
    with backend.open() as store:
        assert store.schema_version == 3
    assert backend.rows("SELECT version FROM lamina_schema") == [(3,)]
    assert _every_turn(backend, cid) == EXPECTED


def test_old_decisions_keep_their_reason_and_say_what_was_done(backend: Backend) -> None:
    """Turn 23 re-sent the spec (the library held only its stub) and pinned a changed
    note: two decisions of the same stage, layer and forms, told apart by their reason."""
    cid = legacy_store("a7b9f6f", backend)
    with backend.open(read_only=True) as store:
        manifest = store.manifest(cid, 23)
        budget = store.manifest(cid, 11)
    assert manifest is not None and budget is not None
    assert [(d.target, d.action, d.reason) for d in manifest.report.decisions] == [
        ("note:project-spec.md", A.RESENT, "library holds only a reference"),
        ("note:docs/auth.md", A.PINNED, "content changed; L2 entry pinned"),
    ]
    assert budget.report.budget is not None
    assert [(d.action, d.layer, d.reason) for d in budget.report.budget.decisions] == [
        (A.COMPACTED, "L2", "library entry compacted to a summary")
    ]


def _snapshot(backend: Backend, h: str) -> Any:
    (body,) = backend.rows("SELECT body FROM snapshots WHERE hash = ?", (h,))[0]
    return json.loads(zlib.decompress(bytes(body)))


@pytest.mark.parametrize("typed", [False, True])
def test_a_decision_field_this_lamina_lacks_is_still_refused(
    backend: Backend, typed: bool
) -> None:
    """An old decision (no action) or a typed one with a field this Lamina does not know
    is ``StoreUnknownFields`` naming it, never read on without it."""
    cid = legacy_store("04fd623", backend)
    (h,) = backend.rows("SELECT manifest_hash FROM turns WHERE turn = 9")[0]
    plain = _snapshot(backend, h)
    report = plain["report"]
    first = report["decisions"][0]
    report["decisions"][0] = {**first, "weight": 2, **({"action": "referenced"} if typed else {})}
    body = canonical(plain)
    newer = digest(body)
    backend.execute(
        "INSERT INTO snapshots VALUES (?, ?, ?)", (newer, "manifest", zlib.compress(body, 6))
    )
    backend.execute("UPDATE turns SET manifest_hash = ? WHERE turn = 9", (newer,))
    with backend.open(read_only=True) as store:
        with pytest.raises(StoreUnknownFields) as info:
            store.manifest(cid, 9)
        assert (info.value.fields, info.value.turn) == (("Decision.weight",), 9)
        assert store.manifest(cid, 8) is not None


# --- the mapping -----------------------------------------------------------------------

# Every decision a Lamina before typed decisions made: (stage, layer, from, to, reason).
# fmt: off
MADE_BEFORE = [
    ("dedup", "L3", "full", "dropped", "duplicate hit sent once", A.DROPPED),
    ("reference", "L3", "reference", "full", "content changed; L2 entry pinned", A.PINNED),
    ("reference", "L2", "summary", "full", "content changed; L2 entry refreshed in place",
     A.REFRESHED),
    ("reference", "L3", "full", "reference", "in library as full", A.REFERENCED),
    ("reference", "L3", "full", "reference", "in library as summary", A.REFERENCED),
    ("reference", "L3", "reference", "full", "library holds only a summary", A.RESENT),
    ("reference", "L3", "full", "dropped", "chunk of note:a.md, sent in full in this turn",
     A.DROPPED),
    ("reference", "L3", "full", "reference", "chunk of note:a.md, in library in full",
     A.REFERENCED),
    ("reference", "L3", "full", "full", "chunk of note:a.md sent: the library entry it "
     "holds a preview", A.OVERLAPPING),
    ("pages", "L3", "full", "dropped", "pages 1-2 already sent (this turn)", A.DROPPED),
    ("pages", "L3", "full", "cut", "pages 1-2 already sent (pdf:a); sent pdf:a#3",
     A.PAGES_CUT),
    ("system", "L1", "text", "text", "system prompt changed", A.SYSTEM_CHANGED),
    ("system", "L1", "text", "text", "L1 mutable part sent whole again (last turn's "
     "budget had shortened it)", A.RESTORED),
    ("budget", "L4", "text", "dropped", "oldest history turns dropped (cut point moves 4 "
     "turns)", A.HISTORY_CUT),
    ("budget", "L4", "text", "excerpt", "long old reply shortened", A.SHORTENED),
    ("budget", "L3", "full", "preview", "L3 item compacted to a preview", A.COMPACTED),
    ("budget", "L3", "preview", "summary", "L3 item compacted to a summary", A.COMPACTED),
    ("budget", "L3", "full", "reference", "L3 item not sent for lack of room (a not-sent "
     "reference says how to get it)", A.NOT_SENT),
    ("budget", "L3", "full", "preview", "L3 item cut to a 64-token preview", A.COMPACTED),
    ("budget", "L2", "full", "preview", "library entry compacted to a preview", A.COMPACTED),
    ("budget", "L2", "summary", "evicted", "library entry evicted to a stub that keeps key, "
     "title and locator", A.EVICTED),
    ("budget", "L1", "text", "preview", "L1 mutable part compacted", A.COMPACTED),
    ("budget", "L1", "text", "excerpt", "L1 mutable part compacted", A.COMPACTED),
    ("budget", "L3", "full", "excerpt", "non-recoverable item cut to a 300-token excerpt "
     "(head and tail kept)", A.EXCERPTED),
    ("budget", "L2", "full", "excerpt", "non-recoverable library entry cut to an excerpt",
     A.EXCERPTED),
    ("budget", "L3", "items", "index", "12 items of folder:docs collapsed into one index "
     "(no form of each fits)", A.INDEXED),
    ("agent", "loop", "full", "stub", "old tool result stubbed", A.STUBBED),
    ("agent", "loop", "full", "excerpt", "old tool result cut to an excerpt", A.EXCERPTED),
]
# fmt: on


@pytest.mark.parametrize(("stage", "layer", "before", "after", "reason", "action"), MADE_BEFORE)
def test_each_old_decision_maker_gets_its_action(
    stage: str, layer: str, before: str, after: str, reason: str, action: DecisionAction
) -> None:
    record = {"stage": stage, "target": "k", "from_form": before, "to_form": after,
              "reason": reason, "tokens_saved": 0, "layer": layer}  # fmt: skip
    assert legacy_action(record) is action


def test_a_decision_no_version_made_takes_the_action_of_its_end_form() -> None:
    """A host's own stage: the closest action by the form it ended in."""
    def of(after: str) -> DecisionAction:
        return legacy_action({"stage": "mine", "from_form": "full", "to_form": after})

    assert [of(f) for f in ("dropped", "preview", "evicted", "stub", "full", "odd")] == [
        A.DROPPED, A.COMPACTED, A.EVICTED, A.STUBBED, A.RESENT, A.COMPACTED,
    ]  # fmt: skip
    assert legacy_action({}) is A.COMPACTED


_VALUES = st.one_of(
    st.sampled_from(["budget", "reference", "system", "agent", "pages", "dedup", "L1", "L2",
                     "L4", "loop", *(str(f) for f in DecisionForm)]),
    st.text(max_size=8),
    st.integers(),
    st.none(),
)  # fmt: skip


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(["stage", "layer", "from_form", "to_form", "reason"]),
                       _VALUES))  # fmt: skip
def test_every_record_gets_an_action(record: dict[str, Any]) -> None:
    """The mapping is total: any record (odd values too) gets one action, and a record
    whose stage no version made gets the one its end form names."""
    action = legacy_action(record)
    assert isinstance(action, DecisionAction)
    if record.get("stage") not in {"budget", "reference", "system", "agent", "pages"}:
        assert action is legacy_action({"to_form": record.get("to_form")})
