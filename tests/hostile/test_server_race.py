"""Two ``lamina serve`` processes on one store, racing turns on one parent: every request is
built on exactly the head it names or answered 409 with the current head; no turn is lost
and every winner can record its reply."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.lamina.server import running
from tests.stores import PgServer

RACES = 200
PER_CONVERSATION = 20  # a fresh conversation now and then keeps each turn cheap


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield str(tmp_path / "shared.sqlite")
    else:
        server: PgServer = request.getfixturevalue("pg_server")
        yield server.create_database()


def _race(clients: list[httpx.Client], cid: str, head: dict[str, Any], n: int) -> list[Any]:
    """Both servers build a turn on ``head`` at once; their responses, in server order."""
    gate = threading.Barrier(len(clients))
    out: list[Any] = [None] * len(clients)

    def build(i: int) -> None:
        body = {"parent": head, "user": f"race {n} via {i}"}
        gate.wait()
        out[i] = clients[i].post(f"/v1/conversations/{cid}/turns", json=body)

    threads = [threading.Thread(target=build, args=(i,)) for i in range(len(clients))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def test_racing_servers_build_only_on_the_named_head(store: str) -> None:
    with (
        running(store) as a,
        running(store) as b,
        httpx.Client(base_url=a, timeout=60) as ca,
        httpx.Client(base_url=b, timeout=60) as cb,
    ):
        clients = [ca, cb]
        won: dict[str, list[str]] = {}
        cid, head = "", {"turn": 0, "hash": ""}
        for n in range(RACES):
            if n % PER_CONVERSATION == 0:
                created = ca.post("/v1/conversations", json={}).json()
                cid, head = created["id"], created["head"]
                won[cid] = []
            responses = _race(clients, cid, head, n)
            statuses = sorted(r.status_code for r in responses)
            assert statuses == [200, 409], [r.text for r in responses]
            winner = next(i for i, r in enumerate(responses) if r.status_code == 200)
            built, refused = responses[winner].json(), responses[1 - winner].json()
            # Built on the head it named: the next turn, nothing in between.
            assert built["turn"] == head["turn"] + 1
            assert refused["field"] == "parent" and refused["head"] == built["head"]
            won[cid].append(f"race {n} via {winner}")
            # The winner's reply goes to the other server (now stale): it is recorded.
            answer = {"parent": built["head"], "text": f"answer {n}"}
            replied = clients[1 - winner].post(f"/v1/conversations/{cid}/reply", json=answer)
            assert replied.status_code == 200, replied.text
            head = replied.json()["head"]
        for conversation, users in won.items():
            transcript = ca.get(f"/v1/conversations/{conversation}/transcript").json()
            markdown = transcript["markdown"]
            positions = [markdown.index(u) for u in users]  # none lost, in order
            assert positions == sorted(positions)
            assert markdown.count("race ") == len(users)  # and no loser saved
            assert ca.get(f"/v1/conversations/{conversation}").json()["head"]["turn"] == len(users)
