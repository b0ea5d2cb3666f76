"""`lamina serve` over real HTTP: byte-identical to `lamina run --json`, client notes,
conflicts, restarts, errors, limits and slow URLs."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.cli import lamina
from tests.lamina.server import VAULT, WALKTHROUGH, create, reply, run_turns, running, turn
from tests.stores import Backend, PgServer, legacy_store

EMPTY = {"turn": 0, "hash": ""}


@pytest.fixture
def base(tmp_path: Path) -> Iterator[str]:
    with running(tmp_path / "store.sqlite", "--vault", str(VAULT), "--max-body", "200000") as url:
        yield url


@pytest.fixture
def client(base: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=base, timeout=60) as c:
        yield c


def test_the_walkthrough_over_http_is_byte_identical_to_run_json(
    client: httpx.Client, tmp_path: Path
) -> None:
    conv = create(client, system=WALKTHROUGH["system"], provider="openai")
    cid = conv["id"]
    built, _ = run_turns(client, cid, EMPTY, WALKTHROUGH["turns"])

    script = tmp_path / "walkthrough.json"
    script.write_text(json.dumps({**WALKTHROUGH, "vault": str(VAULT)}), encoding="utf-8")
    store = tmp_path / "cli.sqlite"
    args = ("--json", "--store", str(store), "--conversation", cid, "--provider", "openai")
    result = lamina("run", str(script), *args)
    assert result.returncode == 0, result.stderr
    expected = json.loads(result.stdout)

    served = client.get(f"/v1/conversations/{cid}/trace").json()
    assert served == expected
    for got, want in zip(built, expected["turns"], strict=True):
        assert got["messages"] == want["messages"]
        assert {k: v["hash"] for k, v in got["layers"].items()} == {
            k: v["hash"] for k, v in want["layers"].items()
        }
        assert got["request"] == want["request"]
        assert got["cache"] == want["cache"]
    one = client.get(f"/v1/conversations/{cid}/turns/2/trace").json()
    assert one["messages"] == expected["turns"][1]["messages"]
    request = client.get(f"/v1/conversations/{cid}/turns/3/request").json()
    assert request == expected["turns"][2]["request"]
    anthropic = client.get(f"/v1/conversations/{cid}/turns/3/request?provider=anthropic").json()
    assert anthropic["system"][0]["text"].startswith(WALKTHROUGH["system"]["stable"])


def _vault_notes() -> list[dict[str, str]]:
    return [
        {"path": p.relative_to(VAULT).as_posix(), "content": p.read_text(encoding="utf-8")}
        for p in sorted(VAULT.rglob("*.md"))
    ]


def test_client_notes_give_the_same_request_as_the_server_vault(client: httpx.Client) -> None:
    turns = WALKTHROUGH["turns"][:3]
    server = create(client, system="You are terse.")
    from_vault, _ = run_turns(client, server["id"], EMPTY, turns)
    local = create(client, system="You are terse.", vault=False)
    notes = _vault_notes()
    sent = [{**t, "notes": notes} for t in turns]
    from_client, _ = run_turns(client, local["id"], EMPTY, sent)
    for a, b in zip(from_vault, from_client, strict=True):
        assert a["messages"] == b["messages"]
        assert a["layers"] == b["layers"]
    # A wikilink between sent notes resolves as it does in the vault.
    assert "docs/api-docs.md" in json.dumps(from_client[1]["layers"]["L3"])


def test_an_edited_client_note_is_pinned_like_an_edited_vault_note(client: httpx.Client) -> None:
    conv = create(client, vault=False)
    note = {"path": "plan.md", "content": "# Plan\n\nShip on Friday.\n"}
    first = turn(client, conv["id"], EMPTY, user="read", attach=[{"note": "plan.md"}], notes=[note])
    edited = {**note, "content": "# Plan\n\nShip on Monday.\n", "mtime": 1767225600.0}
    second = turn(
        client,
        conv["id"],
        first["head"],
        user="again",
        attach=[{"note": "plan.md"}],
        notes=[edited],
    )
    assert "Friday" in second["messages"][0]["content"]  # L2 keeps its bytes (pin)
    assert "Monday" in second["messages"][-1]["content"]  # the new version goes to L3
    assert second["cache"]["break_reason"] is None


def test_two_clients_building_the_same_turn_one_wins_nothing_is_lost(
    client: httpx.Client, base: str
) -> None:
    conv = create(client)
    cid = conv["id"]
    head = turn(client, cid, EMPTY, user="first", attach=[{"note": "glossary.md"}])["head"]
    results: dict[str, httpx.Response] = {}
    gate = threading.Barrier(2)

    def build(name: str) -> None:
        with httpx.Client(base_url=base, timeout=60) as c:
            gate.wait()
            results[name] = c.post(
                f"/v1/conversations/{cid}/turns",
                json={"parent": head, "user": f"second from {name}"},
            )

    threads = [threading.Thread(target=build, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    statuses = sorted(r.status_code for r in results.values())
    assert statuses == [200, 409]
    winner = next(n for n, r in results.items() if r.status_code == 200)
    loser = results["b" if winner == "a" else "a"].json()
    assert loser["field"] == "parent"
    assert loser["head"] == results[winner].json()["head"]
    # The loser builds again on the new head: both turns are there, in order.
    retry = turn(client, cid, loser["head"], user="second again")
    assert retry["turn"] == 3
    transcript = client.get(f"/v1/conversations/{cid}/transcript").json()["markdown"]
    users = ["first", f"second from {winner}", "second again"]
    positions = [transcript.index(u) for u in users]
    assert positions == sorted(positions)
    stale = client.post(f"/v1/conversations/{cid}/turns", json={"parent": head, "user": "x"})
    assert stale.status_code == 409
    assert stale.json()["head"] == retry["head"]


def test_a_restart_loses_nothing_and_the_next_turn_is_byte_identical(tmp_path: Path) -> None:
    glossary = {"user": "And the glossary?", "attach": [{"note": "glossary.md"}]}
    turns = [*WALKTHROUGH["turns"][:3], glossary]
    settings = {"system": WALKTHROUGH["system"], "provider": "anthropic", "window": 6000}
    store = tmp_path / "s.sqlite"
    with running(store, "--vault", str(VAULT)) as url, httpx.Client(base_url=url, timeout=60) as c:
        steady = create(c, **settings)
        uninterrupted, _ = run_turns(c, steady["id"], EMPTY, turns)
        moving = create(c, **settings)
        _, head = run_turns(c, moving["id"], EMPTY, turns[:2])
    with running(store, "--vault", str(VAULT)) as url, httpx.Client(base_url=url, timeout=60) as c:
        listed = {x["id"]: x for x in c.get("/v1/conversations").json()["conversations"]}
        assert listed[moving["id"]]["head"] == head
        rest, _ = run_turns(c, moving["id"], head, turns[2:])
        again = c.get(f"/v1/conversations/{moving['id']}/turns/1/trace").json()
    for a, b in zip(uninterrupted[2:], rest, strict=True):
        assert {k: v for k, v in a.items() if k not in ("conversation_id", "head", "request")} == {
            k: v for k, v in b.items() if k not in ("conversation_id", "head", "request")
        }
        assert a["request"]["messages"] == b["request"]["messages"]
        assert a["request"]["system"] == b["request"]["system"]
    assert again["messages"] == uninterrupted[0]["messages"]


def test_two_servers_on_one_postgres_database_continue_each_others_turns(
    tmp_path: Path, pg_server: PgServer
) -> None:
    store = pg_server.create_database()
    turns = WALKTHROUGH["turns"][:3]
    with running(tmp_path / "one.sqlite", "--vault", str(VAULT)) as url, _client(url) as c:
        alone, _ = run_turns(c, create(c, system=WALKTHROUGH["system"])["id"], EMPTY, turns)
    with (
        running(store, "--vault", str(VAULT)) as a,
        running(store, "--vault", str(VAULT)) as b,
        _client(a) as ca,
        _client(b) as cb,
    ):
        cid = create(ca, system=WALKTHROUGH["system"])["id"]
        shared, head = run_turns(ca, cid, EMPTY, turns[:1])
        more, head = run_turns(cb, cid, head, turns[1:2])  # the other worker goes on
        last, head = run_turns(ca, cid, head, turns[2:])  # and the first sees its turn
        stale = ca.post(f"/v1/conversations/{cid}/turns", json={"parent": EMPTY, "user": "x"})
        listed = cb.get("/v1/conversations").json()["conversations"]
    assert stale.status_code == 409 and stale.json()["head"] == head
    assert [x["id"] for x in listed] == [cid] and listed[0]["head"] == head
    for a_turn, b_turn in zip(alone, [*shared, *more, *last], strict=True):
        assert a_turn["messages"] == b_turn["messages"]
        assert a_turn["cache"] == b_turn["cache"]


def _client(url: str) -> httpx.Client:
    return httpx.Client(base_url=url, timeout=60)


class _ChangingPage(http.server.BaseHTTPRequestHandler):
    body = b"<html><body><article><p>First version of the page.</p></article></body></html>"

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: Any) -> None:
        pass


def test_after_a_restart_a_turn_whose_parent_cannot_be_rebuilt_still_goes_through(
    tmp_path: Path,
) -> None:
    page = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _ChangingPage)
    threading.Thread(target=page.serve_forever, daemon=True).start()
    address = f"http://127.0.0.1:{page.server_address[1]}/page.html"
    store = tmp_path / "s.sqlite"
    try:
        with running(store, "--allow-private-network") as url, _client(url) as c:
            cid = create(c)["id"]
            head = turn(c, cid, EMPTY, user="read", attach=[{"url": address}])["head"]
        _ChangingPage.body = b"<html><body><article><p>Changed.</p></article></body></html>"
        with running(store, "--allow-private-network") as url, _client(url) as c:
            rebuilt = c.get(f"/v1/conversations/{cid}/turns/1/trace")
            second = turn(c, cid, head, user="and now?")
    finally:
        page.shutdown()
    assert rebuilt.status_code == 409  # turn 1 itself cannot be shown again ...
    assert second["head"]["turn"] == 2  # ... but the conversation goes on
    assert {k: v for k, v in second["cache"].items() if k != "sentence"} == {
        "common_prefix_tokens": 0,
        "break_reason": "previous-not-rebuilt",
    }
    assert second["cache"]["sentence"].startswith("The previous request (turn 1) could not")


@pytest.mark.parametrize("commit", ["a7b9f6f", "87f7834"])
def test_a_turn_on_a_store_an_older_lamina_wrote_compares_with_the_request_it_sent(
    backend: Backend, commit: str
) -> None:
    """No old turn replays identically; turn 30 is told from its stored manifest, so the
    next turn's cache report is what it repeats of that request (``lamina resume``'s
    figures), and turn 30's trace can be shown."""
    cid = legacy_store(commit, backend)
    with running(backend.value, "--vault", str(VAULT)) as url, _client(url) as c:
        head = c.get(f"/v1/conversations/{cid}").json()["head"]
        built = turn(c, cid, head, user="Turn 31: and the spec?")
        told = c.get(f"/v1/conversations/{cid}/turns/30/trace")
    assert built["cache"] == {
        "a7b9f6f": {"common_prefix_tokens": 2948, "break_reason": None, "sentence": ""},
        "87f7834": {"common_prefix_tokens": 2738, "break_reason": None, "sentence": ""},
    }[commit]
    assert told.status_code == 200, told.text


def test_errors_are_one_json_sentence_with_the_field(client: httpx.Client) -> None:
    missing = client.post("/v1/conversations/nope/turns", json={"parent": EMPTY, "user": "x"})
    assert missing.status_code == 404
    assert missing.json() == {
        "error": "no conversation with this id",
        "field": "conversation_id",
        "status": 404,
    }
    cid = create(client)["id"]
    bad_kind = client.post(
        f"/v1/conversations/{cid}/turns",
        json={"parent": EMPTY, "user": "x", "attach": [{"nope": 1}]},
    )
    assert bad_kind.status_code == 422
    assert bad_kind.json()["field"] == "attach[0]"
    escape = client.post(
        f"/v1/conversations/{cid}/turns",
        json={"parent": EMPTY, "user": "x", "attach": [{"note": "../../etc/passwd"}]},
    )
    assert escape.status_code == 422
    assert "vault" in escape.json()["error"]
    unknown_field = client.post(
        f"/v1/conversations/{cid}/turns", json={"parent": EMPTY, "usr": "x"}
    )
    assert unknown_field.status_code == 422
    assert unknown_field.json()["field"] in ("user", "usr")
    not_json = client.post(
        f"/v1/conversations/{cid}/turns",
        content=b"{not json",
        headers={"Content-Type": "application/json"},
    )
    assert not_json.status_code == 400
    assert not_json.json()["field"] == "body"
    huge = client.post(
        f"/v1/conversations/{cid}/turns", json={"parent": EMPTY, "user": "x" * 300_000}
    )
    assert huge.status_code == 413
    assert huge.json()["field"] == "body"
    bad_model = client.post("/v1/conversations", json={"model": "no-such-model"})
    assert bad_model.status_code == 422
    assert bad_model.json()["field"] == "model"
    no_reply_yet = client.post(
        f"/v1/conversations/{cid}/reply", json={"parent": EMPTY, "text": "a"}
    )
    assert no_reply_yet.status_code == 409
    for response in (missing, bad_kind, escape, unknown_field, not_json, huge, bad_model):
        assert "Traceback" not in response.text
        assert response.headers["content-type"] == "application/json"
    # A turn that failed left nothing behind: the conversation is still at turn 0.
    assert client.get(f"/v1/conversations/{cid}").json()["head"] == EMPTY


def test_a_note_over_the_text_cap_is_413(tmp_path: Path) -> None:
    with running(tmp_path / "s.sqlite", "--max-text", "1000") as url, httpx.Client(
        base_url=url, timeout=60
    ) as c:
        cid = create(c, vault=False)["id"]
        response = c.post(
            f"/v1/conversations/{cid}/turns",
            json={"parent": EMPTY, "user": "x", "notes": [{"path": "a.md", "content": "y" * 2000}]},
        )
        assert response.status_code == 413
        assert response.json()["field"] == "notes[0].content"


def test_list_get_delete(client: httpx.Client) -> None:
    a = create(client, title="a")["id"]
    b = create(client, title="b")["id"]
    assert len(a) == 32 and a != b
    ids = {c["id"] for c in client.get("/v1/conversations").json()["conversations"]}
    assert {a, b} <= ids
    assert client.delete(f"/v1/conversations/{a}").status_code == 204
    assert client.get(f"/v1/conversations/{a}").status_code == 404
    assert client.delete(f"/v1/conversations/{a}").status_code == 404
    assert client.get(f"/v1/conversations/{b}").json()["title"] == "b"


class _SlowPage(http.server.BaseHTTPRequestHandler):
    release = threading.Event()

    def do_GET(self) -> None:
        self.release.wait(60)
        body = b"<html><head><title>Slow</title></head><body><p>Slow page text.</p></body></html>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def test_a_slow_url_does_not_stall_other_conversations(tmp_path: Path) -> None:
    page = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _SlowPage)
    threading.Thread(target=page.serve_forever, daemon=True).start()
    slow_url = f"http://127.0.0.1:{page.server_address[1]}/slow.html"
    order: list[str] = []
    try:
        with running(tmp_path / "s.sqlite", "--allow-private-network") as url:
            with httpx.Client(base_url=url, timeout=60) as c:
                slow, fast = create(c)["id"], create(c)["id"]

            def fetch() -> None:
                with httpx.Client(base_url=url, timeout=60) as c:
                    r = turn(c, slow, EMPTY, user="read", attach=[{"url": slow_url}])
                    assert "Slow page text." in r["messages"][-1]["content"]
                    order.append("slow")

            waiting = threading.Thread(target=fetch)
            waiting.start()
            with httpx.Client(base_url=url, timeout=60) as c:
                for i in range(3):  # the other conversation's turns go through meanwhile
                    head = c.get(f"/v1/conversations/{fast}").json()["head"]
                    turn(c, fast, head, user=f"quick {i}")
                    order.append("fast")
            _SlowPage.release.set()
            waiting.join()
    finally:
        _SlowPage.release.set()
        page.shutdown()
    assert order == ["fast", "fast", "fast", "slow"]


def test_reply_saves_the_answer_into_history(client: httpx.Client) -> None:
    cid = create(client)["id"]
    head = turn(client, cid, EMPTY, user="hello")["head"]
    head = reply(client, cid, head, "Hi there.")
    second = turn(client, cid, head, user="again")
    assert [m["role"] for m in second["messages"]] == ["user", "assistant", "user"]
    assert second["messages"][1]["content"] == "Hi there."
    twice = client.post(f"/v1/conversations/{cid}/reply", json={"parent": head, "text": "b"})
    assert twice.status_code == 409


def _recall_turns() -> list[dict[str, Any]]:
    """A chat whose first turn holds a fact that the budget drops from history and the
    last turn asks for."""
    filler = "The weather report went on about clouds, rain and the wind over the hills. " * 12
    turns: list[dict[str, Any]] = [
        {"user": "Remember this: the vault's secret code is zebra-42.", "reply": "Noted."}
    ]
    for k in range(8):
        turns.append({"user": f"Tell me about topic {k}.", "reply": f"Topic {k}. {filler}"})
    turns.append({"user": "What is the vault's secret code?"})
    return turns


def test_recall_is_a_conversation_setting_and_matches_run(
    client: httpx.Client, tmp_path: Path
) -> None:
    """A conversation created with a window (recall on by default) recalls dropped history
    exactly as `lamina run --window` does; ``recall: false`` turns it off; recall without
    a window is refused by name."""
    turns = _recall_turns()
    conv = create(client, system="You are terse.", window=1500, reserve=300)
    built, _ = run_turns(client, conv["id"], EMPTY, turns)
    last = built[-1]
    recalled = [s["key"] for s in last["layers"]["L3"]["segments"]]
    assert "recalled:history" in recalled, recalled
    script = tmp_path / "recall.json"
    script.write_text(json.dumps({"system": "You are terse.", "turns": turns}), encoding="utf-8")
    ran = lamina("run", str(script), "--json", "--window", "1500", "--reserve", "300")
    assert ran.returncode == 0, ran.stderr
    expected = json.loads(ran.stdout)["turns"]
    assert [t["messages"] for t in built] == [t["messages"] for t in expected]
    off = create(client, system="You are terse.", window=1500, reserve=300, recall=False)
    built_off, _ = run_turns(client, off["id"], EMPTY, turns)
    assert "recalled:history" not in [s["key"] for s in built_off[-1]["layers"]["L3"]["segments"]]
    refused = client.post("/v1/conversations", json={"recall": True})
    assert refused.status_code in (400, 422) and "recall" in refused.text


def test_the_budget_objective_is_a_conversation_setting(client: httpx.Client) -> None:
    """A conversation's ``objective`` sets the budget objective's settings its turns are
    fitted with (the trace reports them); an unknown key or a bad value is 422 naming
    ``objective.<field>``, and settings without a window or model are refused by name."""
    cid = create(client, window=3000, reserve=400, objective={"headroom": 0.1})["id"]
    built = turn(client, cid, EMPTY, user="hello", attach=[{"note": "project-spec.md"}])
    plan = built["budget"]["plan"]
    assert (plan["headroom"], plan["headroom_tokens"]) == ("0.1", "260")
    assert plan["cache_weight"] == "0.9"  # not given: the default
    head = reply(client, cid, built["head"], "ok")
    again = turn(client, cid, head, user="and again")
    assert again["budget"]["plan"] == plan
    for body, field in (
        ({"window": 3000, "objective": {"floor": 0.3}}, "objective.floor"),
        ({"window": 3000, "objective": {"history_step": 4}}, "objective.history_step"),
        ({"window": 3000, "objective": {"headroom": 1.5}}, "objective.headroom"),
        ({"window": 3000, "objective": {"cache_weight": "no"}}, "objective.cache_weight"),
        ({"objective": {"headroom": 0.1}}, "objective"),
    ):
        refused = client.post("/v1/conversations", json=body)
        assert refused.status_code == 422, refused.text
        assert refused.json()["field"] == field


def test_the_hot_lane_answers_what_the_fastapi_routes_answer(client: httpx.Client) -> None:
    """Turns and replies as hosts send them (``application/json``) take the HotLane; with
    a charset parameter they go through FastAPI's routes: same turns, same answers, byte
    for byte but the conversation id, and the same refusals."""

    def post(cid: str, route: str, body: dict[str, Any], content_type: str) -> httpx.Response:
        return client.post(
            f"/v1/conversations/{cid}/{route}",
            content=json.dumps(body).encode(),
            headers={"Content-Type": content_type},
        )

    answers = []
    for content_type in ("application/json", "application/json; charset=utf-8"):
        cid = create(client)["id"]
        head = EMPTY
        bodies = []
        for user, attach in (("first", [{"note": "glossary.md"}]), ("second", [])):
            built = post(
                cid, "turns", {"parent": head, "user": user, "attach": attach}, content_type
            )
            assert built.status_code == 200, built.text
            replied = post(
                cid, "reply", {"parent": built.json()["head"], "text": "ok"}, content_type
            )
            assert replied.status_code == 200, replied.text
            for response in (built, replied):
                assert response.headers["content-type"] == "application/json"
                bodies.append(response.content.replace(cid.encode(), b"CID"))
            head = replied.json()["head"]
        for route, body in (
            ("turns", {"parent": EMPTY, "user": "late"}),
            ("reply", {"parent": EMPTY, "text": "late"}),
            ("reply", {"parent": head}),
        ):
            refused = post(cid, route, body, content_type)
            assert refused.status_code in (409, 422)
            bodies.append(refused.content)
        answers.append(bodies)
    assert answers[0] == answers[1]


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


# Bodies the HotLane must not take itself: each is FastAPI's to answer.
_TOOL = '{"parent": {"turn": 0, "hash": ""}, "user": "x", "tools": [{"name": "t", "args": '
_ATTACH = '{"parent": {"turn": 0, "hash": ""}, "user": "x", "attach": [{"a": '
HOSTILE_TURNS = {
    "deep list": _nested(20_000),
    "deep args": _TOOL + '{"a": ' + _nested(975) + "}}]}",
    "args past 64": _TOOL + '{"a": ' + _nested(70) + "}}]}",
    "deep attach": _ATTACH + _nested(900) + "}]}",
    "not JSON": '{"parent": ',
    "not an object": "[1, 2]",
}


def test_the_hot_lane_leaves_every_body_it_does_not_take_to_fastapi(client: httpx.Client) -> None:
    """The same hostile bodies as ``application/json`` (the HotLane's) and with a charset
    (FastAPI's route): the same status and error, never a 500; deep tool arguments are
    refused naming their field. A body with no Content-Type or another type is refused
    as FastAPI refuses it (422), and nothing is saved."""
    cid = create(client)["id"]
    url = f"/v1/conversations/{cid}"
    answers: dict[str, list[tuple[int, Any]]] = {}
    for name, text in {**HOSTILE_TURNS, "reply": _nested(20_000)}.items():
        route = "reply" if name == "reply" else "turns"
        for content_type in ("application/json", "application/json; charset=utf-8"):
            response = client.post(
                f"{url}/{route}", content=text.encode(), headers={"Content-Type": content_type}
            )
            answers.setdefault(name, []).append((response.status_code, response.json()))
    for name, (lane, route) in answers.items():
        assert lane == route, name
        assert lane[0] in (400, 422), (name, lane)
    refused = {"error": "the body is not valid JSON, or nests too deeply", "field": "body"}
    assert answers["deep list"][0] == (400, {**refused, "status": 400})
    assert answers["args past 64"][0][1]["field"] == "tools[0].args"
    assert answers["deep attach"][0][1]["field"] == "attach[0]"
    fine = json.dumps({"parent": EMPTY, "user": "hi"}).encode()
    for headers in ({}, {"Content-Type": "text/plain"}):
        untyped = client.post(f"{url}/turns", content=fine, headers=headers)
        assert untyped.status_code == 422, untyped.text
    assert client.get(url).json()["head"] == EMPTY


def test_the_transcript_keeps_the_creation_body_under_settings(client: httpx.Client) -> None:
    """``GET .../transcript`` shows the server's creation body as a ``settings:`` entry
    (not a tag a person gave), and importing the transcript keeps it exactly."""
    from lamina.pipeline.store import parse_transcript

    cid = create(client, window=3000, reserve=300, defer_library=False)["id"]
    turn(client, cid, EMPTY, user="hi")
    markdown = client.get(f"/v1/conversations/{cid}/transcript").json()["markdown"]
    settings = '{"window":3000,"reserve":300,"defer_library":false}'
    assert "\ntags: []\nsettings:\n  lamina-serve: '" + settings + "'\n" in markdown
    assert parse_transcript(markdown, "chat.md").tags == ("lamina-serve:" + settings,)


def test_defer_library_is_a_conversation_setting(tmp_path: Path) -> None:
    """``defer_library`` (default true, like the library) picks the layout a
    conversation's turns are built with: each turn's messages are those the library builds
    with the same switch; the setting is listed, kept across a restart, and a value that is
    not a JSON boolean is 422 naming it."""
    from lamina import Conversation
    from lamina.renderers import openai_messages

    turns = [
        {"user": "What is the plan?", "attach": [{"note": "project-spec.md"}], "reply": "A spec."},
        {"user": "And the glossary?", "attach": [{"note": "glossary.md"}], "reply": "Terms."},
        {"user": "Thanks.", "reply": "Welcome."},
    ]
    store = tmp_path / "s.sqlite"
    built: dict[bool, list[dict[str, Any]]] = {}
    with running(store, "--vault", str(VAULT)) as url, httpx.Client(base_url=url, timeout=60) as c:
        made = {
            True: create(c, system="Be terse."),
            False: create(c, system="Be terse.", defer_library=False),
        }
        for defer, conv in made.items():
            assert conv["defer_library"] is defer
            built[defer], _ = run_turns(c, conv["id"], EMPTY, turns[:2])
        for body in ({"defer_library": "yes"}, {"defer_library": 1}, {"defer_library": None}):
            refused = c.post("/v1/conversations", json=body)
            assert refused.status_code == 422, refused.text
            assert refused.json()["field"] == "defer_library"
    with running(store, "--vault", str(VAULT)) as url, httpx.Client(base_url=url, timeout=60) as c:
        for defer, conv in made.items():
            got = c.get(f"/v1/conversations/{conv['id']}").json()
            assert got["defer_library"] is defer
            head = got["head"]
            more, _ = run_turns(c, conv["id"], head, turns[2:])
            built[defer] += more
    for defer in (True, False):
        local = Conversation("Be terse.", vault=VAULT, defer_library=defer)
        for t, out in zip(turns, built[defer], strict=True):
            env = local.turn(t["user"], t.get("attach", []))
            local.reply(t["reply"])
            assert out["messages"] == openai_messages(env)
            assert ("batch" in out) is defer
    # Deferred, turn 2's request keeps the system message of turn 1 (a byte extension).
    assert built[True][1]["messages"][0] == built[True][0]["messages"][0]
    assert built[False][1]["messages"][0] != built[False][0]["messages"][0]
