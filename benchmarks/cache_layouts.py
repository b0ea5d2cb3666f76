"""Cache cost of the layouts on the demo and on a 30-turn scripted chat (also under a
6,000-token budget, where append-only no longer fits the window and the default settles its
deferred library growth), beside the library layout as built (``defer_library=False``).

Run: ``python benchmarks/cache_layouts.py [--write-script] [--json OUT]``. Deterministic:
the chat is generated from fixed lists, and costs come from ``lamina.renderers.simulate``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
CHAT30 = ROOT / "examples" / "chat30.yaml"

_ATTACH: dict[int, list[dict[str, Any]]] = {
    0: [{"note": "project-spec.md"}],
    1: [{"note": "docs/api-docs.md"}],
    3: [{"note": "docs/auth.md"}, {"note": "project-spec.md"}],
    5: [{"pdf": "media/sync-design-review.pdf"}],
    6: [{"note": "glossary.md"}],
    8: [{"folder": "meetings"}],
    10: [{"note": "project-spec.md"}],
    11: [
        {
            "selection": "Conflict versions are kept for 90 days after a person resolves them, "
            "then purged by the nightly job.",
            "source": "meetings/2026-11-02.md",
        }
    ],
    13: [{"note": "docs/api-docs.md"}, {"note": "glossary.md"}],
    16: [{"note": "docs/auth.md"}],
    19: [{"note": "meetings/2026-11-02.md"}],
    22: [{"note": "project-spec.md"}, {"note": "docs/auth.md"}],
    25: [{"pdf": "media/sync-design-review.pdf"}],
    28: [{"note": "docs/api-docs.md"}],
}
_TOPICS = (
    "the sync protocol",
    "conflict handling",
    "the push phase",
    "token refresh",
    "photo downloads",
    "the audit log",
    "milestone M3",
    "offline edits",
    "roles",
    "the snapshot interval",
)
_AUTH_EDIT = (
    "# Authentication\n\nAccess tokens live 10 minutes; refresh tokens 30 days and are bound "
    "to a device. A refresh rotates the refresh token. Removing a member revokes all of "
    "their refresh tokens at once.\n"
)


def chat_script(turns: int = 30) -> dict[str, Any]:
    """A deterministic scripted chat over examples/vault (one note edited at turn 16)."""
    out: list[dict[str, Any]] = []
    for i in range(turns):
        topic = _TOPICS[i % len(_TOPICS)]
        turn: dict[str, Any] = {
            "user": f"Turn {i + 1}: what do the attached notes say about {topic}?"
        }
        if i in _ATTACH:
            turn["attach"] = _ATTACH[i]
        if i == 16:
            turn["vault_changes"] = {"docs/auth.md": _AUTH_EDIT}
        turn["reply"] = f"On {topic}: " + " ".join(
            f"point {k + 1} follows from the spec's section on {_TOPICS[(i + k) % len(_TOPICS)]}."
            for k in range(3 + i % 4)
        )
        out.append(turn)
    return {
        "vault": "vault",
        "system": {
            "stable": "You are the Fieldbook project assistant. Answer from the attached "
            "context and cite note paths. Say so when the context does not answer.",
            "mutable": "User memory: prefers short answers with bullet points.",
        },
        "turns": out,
    }


def main(argv: list[str] | None = None) -> int:
    from lamina import Conversation, load_script, parse_script, run_script
    from lamina._cli import DEMO_SCRIPT
    from lamina.pipeline import Budget
    from lamina.renderers import build_prompt, prompt_tokens
    from lamina.renderers._simulate import format_simulation, simulate

    parser = argparse.ArgumentParser()
    parser.add_argument("--write-script", action="store_true", help="rewrite examples/chat30.yaml")
    parser.add_argument("--json", help="write the results as JSON here")
    args = parser.parse_args(argv)
    if args.write_script:
        CHAT30.write_text(
            yaml.safe_dump(chat_script(), sort_keys=False, width=100), encoding="utf-8"
        )
    results: dict[str, Any] = {}
    for name, script, window in (
        ("demo", parse_script(DEMO_SCRIPT, "demo", base=ROOT / "examples"), None),
        ("chat30", load_script(CHAT30), None),
        ("chat30-6000", load_script(CHAT30), 6000),
    ):
        vault = script.vault or ROOT / "examples" / "vault"
        budget = None if window is None else Budget(context_window=window, reserve_output=1500)
        conv = Conversation(script.system, vault=vault, budget=budget)
        envs = run_script(script, conv)
        sim = simulate(envs, counter=conv.counter, budget=budget)
        print(
            f"== {name} ({len(script.turns)} turns{'' if window is None else f', window {window}'})"
        )
        print(format_simulation(sim))
        data = sim.to_json()
        over = {}
        if budget is not None:  # requests over the budget's limit, per layout
            for layout in data["layouts"]:
                over[layout] = sum(
                    prompt_tokens(
                        build_prompt(envs[: i + 1], layout, conv.counter), conv.counter, budget
                    )
                    > (env.report.budget.limit if env.report.budget else 0)
                    for i, env in enumerate(envs)
                )
            print(
                "turns over the budget's limit: " + ", ".join(f"{k} {v}" for k, v in over.items())
            )
        # The library layout as built (the default before the library's growth was
        # deferred), for comparison: the same script with defer_library=False.
        built = Conversation(script.system, vault=vault, budget=budget, defer_library=False)
        built_sim = simulate(
            run_script(script, built), counter=built.counter, budget=budget, layouts=("default",)
        )
        for provider in ("openai", "anthropic"):
            append = sim.get("append-only", provider).cost
            ratio = {
                layout: sim.get(layout, provider).cost / append for layout in ("default", "batched")
            }
            ratio["as-built"] = built_sim.get("default", provider).cost / append
            print(
                f"cost vs append-only ({provider}): default {ratio['default']:.3f}, "
                f"batched {ratio['batched']:.3f}, as built (library in the system message) "
                f"{ratio['as-built']:.3f}"
            )
            data[f"vs_append_only_{provider}"] = {k: round(v, 4) for k, v in ratio.items()}
        data["over_limit"] = over
        results[name] = data
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
