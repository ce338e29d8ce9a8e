"""The deployment's run form, as the Prefect UI builds it from the flow's parameter schema.

The UI sanitises descriptions (text between angle brackets disappears) and shows a "… | None" type toggle
for every field whose schema admits null; both confused operators re-running a release from the UI.
"""

import json

from prefect.utilities.callables import parameter_schema

import pytest

from kepsilon.flows.advise import advise
from kepsilon.flows.release import governed_release
from kepsilon.flows.spec import parse_spec

FLOWS = [governed_release, advise]


def run_form_schema(deployed_flow=governed_release) -> dict:
    """The schema Prefect stores with a deployment of a flow (and renders as its run form)."""
    return parameter_schema(deployed_flow).model_dump_for_openapi()


def walk(node, path=""):
    """Every (path, sub-schema) of a JSON schema."""
    if isinstance(node, dict):
        yield path, node
        for key, value in node.items():
            yield from walk(value, f"{path}/{key}")
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from walk(value, f"{path}/{index}")


@pytest.mark.parametrize("deployed_flow", FLOWS, ids=lambda f: f.name)
def test_every_description_survives_the_forms_sanitiser(deployed_flow):
    schema = run_form_schema(deployed_flow)
    descriptions = [node["description"] for _, node in walk(schema) if isinstance(node.get("description"), str)]
    assert len(descriptions) > 20
    assert [d for d in descriptions if "<" in d or ">" in d] == []


@pytest.mark.parametrize("deployed_flow", FLOWS, ids=lambda f: f.name)
def test_no_optional_field_offers_a_null_type_toggle(deployed_flow):
    nullable = [
        path
        for path, node in walk(run_form_schema(deployed_flow))
        if any(isinstance(option, dict) and option.get("type") == "null" for option in node.get("anyOf", []))
    ]
    assert nullable == []


def test_optional_fields_still_accept_being_left_empty(synthetic_spec_dict):
    # Hiding null from the form must not make the fields required: an omitted value keeps its default.
    spec = parse_spec({**synthetic_spec_dict, "operator": None})
    assert spec.operator is None and spec.source.format is None
    assert "operator" not in json.dumps(run_form_schema()["required"])
