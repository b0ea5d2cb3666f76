"""Typed decisions: a closed set of actions, forms and layers, converted when built."""

from __future__ import annotations

import pytest

from lamina.pipeline import Decision, DecisionAction, DecisionForm, DecisionLayer, Form, LayerName


def test_decision_forms_and_layers_extend_the_view_forms_and_layer_names() -> None:
    assert {str(f) for f in Form} <= {str(f) for f in DecisionForm}
    assert {str(n) for n in LayerName} | {"loop"} == {str(n) for n in DecisionLayer}


def test_a_decision_holds_its_action_form_and_layer_as_enums() -> None:
    d = Decision("budget", "k", Form.FULL, "evicted", "why", layer="L2", action="evicted")
    assert (d.from_form, d.to_form) == (DecisionForm.FULL, DecisionForm.EVICTED)
    assert (d.layer, d.action) == (DecisionLayer.L2, DecisionAction.EVICTED)
    assert d.to_form == "evicted" and str(d.action) == "evicted"


@pytest.mark.parametrize(
    "kwargs",
    [
        {"from_form": "gone"},
        {"layer": "L9"},
        {"action": "content changed"},
    ],
)
def test_a_value_outside_the_closed_sets_is_refused(kwargs: dict[str, str]) -> None:
    fields = {"from_form": "full", "layer": "L3", "action": "dropped", **kwargs}
    with pytest.raises(ValueError):
        Decision("s", "k", fields["from_form"], "full", "why", layer=fields["layer"],
                 action=fields["action"])  # fmt: skip
