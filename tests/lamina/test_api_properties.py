"""Property tests of the API from its own OpenAPI document (schemathesis): whatever the
input, no 5xx, and every error is one JSON sentence with its field."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error

from tests.lamina.server import VAULT, running

SEED: list[str] = []


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    store = Path(tmp_path_factory.mktemp("api")) / "store.sqlite"
    with running(store, "--vault", str(VAULT)) as url:
        # One real conversation with a turn, so paths with its id reach past the 404.
        cid = httpx.post(f"{url}/v1/conversations", json={}, timeout=60).json()["id"]
        parent = {"turn": 0, "hash": ""}
        body = {"parent": parent, "user": "hi", "attach": [{"note": "glossary.md"}]}
        httpx.post(f"{url}/v1/conversations/{cid}/turns", json=body, timeout=60)
        SEED.append(cid)
        yield url


def _operations() -> list[str]:
    """Every operation of the app's own OpenAPI document, by label ("POST /v1/...")."""
    from lamina import ServerConfig, create_app

    document = create_app(ServerConfig(store=":memory:")).openapi()
    return [
        f"{method.upper()} {path}" for path, item in document["paths"].items() for method in item
    ]


@pytest.fixture(scope="module")
def api(base: str) -> Any:
    return schemathesis.openapi.from_url(f"{base}/openapi.json")


@pytest.mark.parametrize("label", _operations())
def test_no_server_errors_and_json_errors(api: Any, label: str) -> None:
    operation = next(op.ok() for op in api.get_all_operations() if op.ok().label == label)
    seen: list[int] = []

    @given(case=operation.as_strategy())
    @settings(
        max_examples=12,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        derandomize=True,
        database=None,
    )
    def check(case: Any) -> None:
        if "conversation_id" in (case.path_parameters or {}) and len(seen) % 2:
            case.path_parameters["conversation_id"] = SEED[0]
        response = case.call(timeout=60)
        case.validate_response(response, checks=[not_a_server_error])
        seen.append(response.status_code)
        assert response.status_code < 500, response.text
        if response.status_code >= 400:
            content_type = response.headers["content-type"]
            assert "application/json" in content_type
            body = response.json()
            assert isinstance(body["error"], str) and body["error"]
            assert "Traceback" not in body["error"]
            assert body["status"] == response.status_code

    check()
    assert seen


# JSON may spell any UTF-16 code unit: strings with lone surrogates among ordinary text.
_SURROGATE_TEXT = st.lists(
    st.one_of(
        st.characters(codec="utf-8"), st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)
    ),
    max_size=6,
).map("".join)


def _bodies(head: dict[str, Any]) -> st.SearchStrategy[tuple[str, dict[str, Any]]]:
    """Requests the schema accepts, every string drawn from ``_SURROGATE_TEXT``."""
    text = _SURROGATE_TEXT
    parent = st.just(head)
    turn = st.fixed_dictionaries(
        {"parent": parent, "user": text},
        optional={
            "attach": st.lists(
                st.dictionaries(st.sampled_from(["note", "folder"]), text), max_size=2
            ),
            "vault_changes": st.dictionaries(text, text, max_size=2),
            "notes": st.lists(
                st.fixed_dictionaries({"path": text.filter(bool), "content": text}), max_size=2
            ),
            "tools": st.lists(
                st.fixed_dictionaries({"name": text.filter(bool), "result": text}), max_size=1
            ),
        },
    )
    create = st.fixed_dictionaries(
        {}, optional={"system": text, "title": text, "tokenizer": text, "model": text}
    )
    reply = st.fixed_dictionaries({"parent": parent, "text": text})
    return st.one_of(
        st.tuples(st.just("/v1/conversations"), create),
        st.tuples(st.just("/v1/conversations/{cid}/turns"), turn),
        st.tuples(st.just("/v1/conversations/{cid}/reply"), reply),
    )


def test_lone_surrogates_anywhere_are_json_errors_and_every_read_still_answers(
    base: str,
) -> None:
    """Every string of every body may hold a lone surrogate (valid JSON): the answer is a
    JSON error or a success, never a 5xx, and the conversation's reads answer afterwards."""
    with httpx.Client(base_url=base, timeout=60) as client:
        cid = client.post("/v1/conversations", json={}).json()["id"]
        head = client.post(
            f"/v1/conversations/{cid}/turns", json={"parent": {"turn": 0, "hash": ""}, "user": "hi"}
        ).json()["head"]

        @given(request=_bodies(head))
        @settings(
            max_examples=40,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            derandomize=True,
            database=None,
        )
        def check(request: tuple[str, dict[str, Any]]) -> None:
            path, body = request
            raw = json.dumps(body).encode()  # ensure_ascii: a surrogate is its \\ud800 escape
            response = client.post(
                path.format(cid=cid), content=raw, headers={"Content-Type": "application/json"}
            )
            assert response.status_code < 500, response.text
            assert "application/json" in response.headers["content-type"]
            if response.status_code >= 400:
                assert response.json()["status"] == response.status_code

        check()
        for read in ("", "/transcript", "/trace", "/turns/1/trace", "/turns/1/request"):
            answer = client.get(f"/v1/conversations/{cid}{read}")
            assert answer.status_code == 200, (read, answer.text)
