"""Cache-cost simulator: hand-computed cases, and layouts compared on real conversations."""

from __future__ import annotations

from pathlib import Path

import pytest

from lamina import Conversation, load_script, parse_script, run_script
from lamina._cli import DEMO_SCRIPT
from lamina.pipeline import Envelope
from lamina.pipeline.tokens import TokenCounter
from lamina.renderers import (
    NAIVE_NOTE,
    CacheRules,
    Simulation,
    format_simulation,
    render_request,
    simulate,
)
from lamina.renderers._simulate import breakpoint_cache_costs, prefix_cache_costs

ROOT = Path(__file__).resolve().parents[2]
OPENAI = CacheRules("openai", "gpt-4.1", min_tokens=1024, step=128, read=0.25)
ANTHROPIC = CacheRules(
    "anthropic", "claude", min_tokens=1024, read=0.1, write=1.25, breakpoints=4, lookback=20
)


def test_openai_hand_computed() -> None:
    """1,300 shared tokens round down to 1,280 cached: 220 + 0.25 * 1,280 = 540."""
    first = list(range(1500))
    second = list(range(1300)) + [-1] * 200
    third = list(range(900)) + [-2] * 600  # shares 900 < 1,024: nothing cached
    costs = prefix_cache_costs([first, second, third], OPENAI)
    assert [(c.cached_tokens, c.cost) for c in costs] == [(0, 1500), (1280, 540.0), (0, 1500)]
    assert costs[1].relative_cost == pytest.approx(0.36)


def test_anthropic_hand_computed() -> None:
    """Turn 1 writes A+B (1,500 at 1.25x); turn 2 finds B's prefix one block back from
    its breakpoint: reads 1,500 at 0.1x, writes D's 800, pays 50 plain."""
    one = ([("A", 1000), ("B", 500), ("C", 100)], [1])
    two = ([("A", 1000), ("B", 500), ("D", 800), ("E", 50)], [2])
    costs = breakpoint_cache_costs([one, two], ANTHROPIC)
    assert [(c.cached_tokens, c.written_tokens, c.cost) for c in costs] == [
        (0, 1500, 100 + 1.25 * 1500),
        (1500, 800, 50 + 0.1 * 1500 + 1.25 * 800),
    ]


def test_anthropic_lookback_is_limited_to_20_blocks() -> None:
    one = ([("A", 2000)], [0])
    far = ([("A", 2000), *[(f"x{i}", 10) for i in range(21)]], [21])
    near = ([("A", 2000), *[(f"x{i}", 10) for i in range(20)]], [20])
    assert breakpoint_cache_costs([one, far], ANTHROPIC)[1].cached_tokens == 0
    assert breakpoint_cache_costs([one, near], ANTHROPIC)[1].cached_tokens == 2000


def _run(
    script_data: object, base: Path, defer: bool = True
) -> tuple[list[Envelope], Conversation]:
    script = parse_script(script_data, "demo", base=base)
    conv = Conversation(
        script.system, vault=script.vault or ROOT / "examples" / "vault", defer_library=defer
    )
    return run_script(script, conv), conv


_WALKTHROUGH = {**DEMO_SCRIPT, "turns": DEMO_SCRIPT["turns"][:3]}  # the three-turn walkthrough


@pytest.fixture(scope="module")
def demo() -> tuple[Simulation, list[Envelope]]:
    envs, conv = _run(_WALKTHROUGH, ROOT / "examples")
    return simulate(envs, counter=conv.counter), envs


@pytest.fixture(scope="module")
def demo_built() -> tuple[Simulation, list[Envelope]]:
    """The walkthrough with the library grown every turn (``defer_library=False``)."""
    envs, conv = _run(_WALKTHROUGH, ROOT / "examples", defer=False)
    return simulate(envs, counter=conv.counter), envs


@pytest.fixture(scope="module")
def chat30() -> Simulation:
    script = load_script(ROOT / "examples" / "chat30.yaml")
    conv = Conversation(script.system, vault=script.vault)
    envs = run_script(script, conv)
    assert len(envs) == 30
    return simulate(envs, counter=conv.counter)


@pytest.mark.parametrize("provider", ["openai", "anthropic", "gemini"])
def test_default_layout_beats_naive_on_the_demo(
    demo: tuple[Simulation, list[Envelope]], provider: str
) -> None:
    """With a 1,024-token Anthropic minimum (Claude Sonnet 4)."""
    sim = simulate(demo[1], models={"anthropic": "claude-sonnet-4"})
    assert sim.get("default", provider).cost < sim.get("naive", provider).cost


def test_a_2048_minimum_makes_the_short_demo_pay_a_write_it_never_reads(
    demo_built: tuple[Simulation, list[Envelope]],
) -> None:
    """Sonnet 4.6 (minimum 2,048), the library grown every turn: the system first reaches
    the minimum on the last turn, so the demo's only cache write (1.25x) is never read."""
    series = demo_built[0].get("default", "anthropic")
    assert series.model == "claude-sonnet-4-6"
    assert [t.cached_tokens for t in series.turns] == [0, 0, 0]
    assert series.turns[2].written_tokens > 0
    assert series.cost > demo_built[0].get("naive", "anthropic").cost


def test_a_deferred_library_reads_back_the_turn_it_wrote(
    demo: tuple[Simulation, list[Envelope]],
) -> None:
    """The default defers the library's growth: turn 2's request, marked at its end,
    reaches the 2,048 minimum and turn 3 (which extends it) reads it back."""
    series = demo[0].get("default", "anthropic")
    assert [t.cached_tokens > 0 for t in series.turns] == [False, False, True]
    assert series.cost < demo[0].get("naive", "anthropic").cost


@pytest.mark.parametrize("provider", ["openai", "anthropic", "gemini"])
def test_default_layout_beats_naive_on_30_turns(chat30: Simulation, provider: str) -> None:
    default, naive = chat30.get("default", provider), chat30.get("naive", provider)
    assert default.cost < 0.5 * naive.cost
    assert default.cached_share > naive.cached_share


def test_simulator_reads_what_the_rendered_request_marked(
    demo_built: tuple[Simulation, list[Envelope]],
) -> None:
    """Turn 2's request marks the end of its system blocks; turn 3 reads exactly that."""
    envs = demo_built[1]
    body = render_request(envs[1], "anthropic", model="claude-sonnet-4-5").body
    assert [("cache_control" in b) for b in body["system"]] == [False, False, False, True]
    counter = TokenCounter()
    marked_prefix = sum(counter.count(b["text"]) for b in body["system"])
    sim = simulate(envs, providers=["anthropic"], models={"anthropic": "claude-sonnet-4-5"})
    assert sim.get("default", "anthropic").turns[2].cached_tokens == marked_prefix


def test_json_and_table(demo: tuple[Simulation, list[Envelope]]) -> None:
    sim = demo[0]
    data = sim.to_json()
    turns = data["layouts"]["default"]["openai"]["turns"]
    assert [t["turn"] for t in turns] == [1, 2, 3]
    assert all(t["cached_tokens"] + t["uncached_tokens"] == t["input_tokens"] for t in turns)
    assert data["layouts"]["naive"]["gemini"]["cost_vs_naive"] == pytest.approx(
        data["layouts"]["naive"]["gemini"]["relative_cost"]
    )
    table = format_simulation(sim)
    # the label, the head, its rule, 12 rows, a blank line and the naive row's note
    assert table.count("\n") == 3 + 12 - 1 + 2
    assert table.endswith(NAIVE_NOTE)
    assert table.startswith("cached: what each provider's rules would serve")
    assert "append-only" in table
