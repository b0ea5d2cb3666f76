"""Random conversations keep invariants 1-6 on every turn and replay identically."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

from lamina import Conversation, parse_script, run_script
from lamina.pipeline import Policy
from lamina.processors import ProcessContext, Sources, Vault
from lamina.renderers import trace_document
from tests.strategies import conversations, localize, serve_site, write_property_vault


@pytest.fixture(scope="module")
def prop_vault(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    root = write_property_vault(tmp_path_factory.mktemp("propvault"))
    with serve_site(root / "site") as base:
        yield root, base


def _trace(script: dict[str, Any], vault: tuple[Path, str], policy: Policy) -> str:
    root, base = vault
    parsed = parse_script(localize(script, base), "generated")
    sources = Sources(context=ProcessContext(vault=Vault(root), allow_private_network=True))
    conv = Conversation(parsed.system, sources=sources, policy=policy)
    envelopes = run_script(parsed, conv, check=True)  # check_envelope(env, previous) per turn
    return json.dumps(trace_document(envelopes, conv.counter), sort_keys=True)


@pytest.mark.parametrize(
    "policy",
    [Policy(), Policy(freshness="refresh"), Policy(reattach="reference", verbatim_tokens=200)],
    ids=["pin", "refresh", "reference-small-l2"],
)
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(script=conversations)
def test_random_conversations_keep_invariants_and_replay_identically(
    script: dict[str, Any], prop_vault: tuple[Path, str], policy: Policy
) -> None:
    first = _trace(script, prop_vault, policy)
    assert first == _trace(script, prop_vault, policy)
    turns = json.loads(first)["turns"]
    for turn in turns:
        for seg in turn["layers"]["L3"]["segments"] + turn["layers"]["L2"]["segments"]:
            if seg["source_type"] == "selection":
                assert seg["form"] in ("full", "excerpt", "reference")
    for earlier, later in itertools.pairwise(turns):
        l2_before = [s["key"] for s in earlier["layers"]["L2"]["segments"]]
        l2_after = [s["key"] for s in later["layers"]["L2"]["segments"]]
        assert l2_after[: len(l2_before)] == l2_before
