"""The deployments' run forms, as the Prefect UI builds them from the schema Prefect stores, and what they send.

Both UIs (V2 and V1) initialise every field from the deployment's parameters, then from the schema's
``default``; a field with neither is left empty and is sent as a missing key (seen in headless Chromium, see
tests/test_prefect_ui.py), or, once a steward has typed and cleared it, possibly as null or ``""``. The
server hydrates the payload (``__prefect_kind`` values) and validates it against the stored schema with
Prefect's own ``schema_tools``; the worker then validates it as the flow's parameters. These tests build
that payload from the stored schema, untouched and with k and ε edited, and put it through both.

The UI also sanitises descriptions (text between angle brackets disappears) and shows a "… | None" toggle
for a field whose schema admits null; only an optional block (the DP settings…) offers "not used".
"""

import copy
import json
import re

import pytest
import yaml
from prefect.utilities.callables import parameter_schema
from prefect.utilities.schema_tools import HydrationContext, hydrate, validate

from kepsilon.flows.advise import advise
from kepsilon.flows.release import governed_release
from kepsilon.flows.run_form import NOT_USED
from kepsilon.flows.spec import parse_spec

from .conftest import ROOT

FLOWS = [governed_release, advise]
DEPLOYMENTS = {"paper-synthetic-nightly": governed_release, "paper-synthetic-advice": advise}
# How a form sends a field left empty: V2 drops it; a cleared field may come as null or as "".
EMPTY_STYLES = ["omitted", "null", "blank"]
OMIT = object()


def run_form_schema(deployed_flow=governed_release) -> dict:
    """The schema Prefect stores with a deployment of a flow (and renders as its run form)."""
    return parameter_schema(deployed_flow).model_dump_for_openapi()


def deployment_parameters(name: str) -> dict:
    """The parameters deployments/prefect.yaml gives a deployment: what its form starts from."""
    deployments = yaml.safe_load((ROOT / "deployments" / "prefect.yaml").read_text())["deployments"]
    return copy.deepcopy(next(d for d in deployments if d["name"] == name)["parameters"])


def walk(node, path=""):
    """Every (path, sub-schema) of a JSON schema."""
    if isinstance(node, dict):
        yield path, node
        for key, value in node.items():
            yield from walk(value, f"{path}/{key}")
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from walk(value, f"{path}/{index}")


def resolve(schema: dict, node: dict) -> dict:
    """A property's schema with its $ref replaced by the definition (the property's own keys win, as in the UIs)."""
    if "$ref" not in node:
        return node
    definition = schema["definitions"][node["$ref"].rsplit("/", 1)[-1]]
    return {**definition, **{key: value for key, value in node.items() if key != "$ref"}}


def empty_value(node: dict, style: str):
    """What a form sends for a field with no value and no default.

    Untouched, both UIs leave it out; a text or number input typed into and cleared may send null or "".
    A choice (an enum's select) cannot be typed into, and is left out.
    """
    if style == "omitted" or node.get("type") not in ("string", "number", "integer") or "enum" in node:
        return OMIT
    if style == "blank" and node.get("type") == "string":
        return ""
    return None


def form_payload(schema: dict, node: dict, given, style: str):
    """The value the form sends for ``node``, starting from the deployment's value ``given`` (OMIT: none)."""
    node = resolve(schema, node)
    if given is OMIT:
        if "default" in node:
            given = copy.deepcopy(node["default"])
        elif node.get("type") == "object" and "properties" not in node and style == "omitted":
            return {"__prefect_kind": "json"}  # V2's JSON editor of a free-form object, left empty
        elif node.get("type") != "object" or "properties" not in node:
            return empty_value(node, style)
    if node.get("type") == "object" and "properties" in node and isinstance(given, dict | type(OMIT)):
        given = {} if given is OMIT else given
        sent = {}
        for name, prop in node["properties"].items():
            value = form_payload(schema, prop, given.get(name, OMIT), style)
            if value is not OMIT:
                sent[name] = value
        return sent
    if node.get("type") == "array" and isinstance(given, list):
        items = node.get("items", {})
        return [form_payload(schema, items, item, style) for item in given]
    if "anyOf" in node and not isinstance(given, dict | list) and given is not None:
        return {"__prefect_kind": "json", "value": json.dumps(given)}  # V1 sends a union's plain value this way
    return given


def submitted(deployed_flow, deployment: str, style: str, edit: dict | None = None) -> dict:
    """The form's payload for a deployment, as the server receives it, untouched or with ``edit`` applied."""
    schema = run_form_schema(deployed_flow)
    given = deployment_parameters(deployment)
    if edit:
        spec = given["spec"] if "spec" in given else given["request"]["spec"]
        spec.update(edit)
    return {
        name: form_payload(schema, prop, given.get(name, OMIT), style) for name, prop in schema["properties"].items()
    }


def as_the_server_and_worker_take_it(deployed_flow, payload: dict) -> dict:
    """Hydrate and validate as the server does on create_flow_run, then validate as the flow's parameters."""
    parameters = hydrate(payload, HydrationContext(raise_on_error=True))
    validate(parameters, run_form_schema(deployed_flow), raise_on_error=True)
    return deployed_flow.validate_parameters(parameters)


@pytest.mark.parametrize("style", EMPTY_STYLES)
@pytest.mark.parametrize("deployment", DEPLOYMENTS)
def test_the_untouched_form_passes_the_servers_schema_check_and_the_flows_parameters(deployment, style):
    deployed_flow = DEPLOYMENTS[deployment]
    payload = submitted(deployed_flow, deployment, style)
    parameters = as_the_server_and_worker_take_it(deployed_flow, payload)
    spec = parameters["spec"] if "spec" in parameters else parameters["request"].spec
    expected = deployment_parameters(deployment)
    expected = expected.get("spec") or expected["request"]["spec"]
    assert (spec.k, spec.epsilon, spec.release_id) == (expected["k"], expected["epsilon"], expected["release_id"])
    # Every empty optional field took its default: the DP block is off, the operator is the OS user's.
    assert spec.privacy_model == "kepsilon" and spec.dp is None
    assert spec.operator is None and spec.source.format is None and spec.max_prosecutor_risk is None


@pytest.mark.parametrize("style", EMPTY_STYLES)
@pytest.mark.parametrize("deployment", DEPLOYMENTS)
def test_an_edited_form_passes_with_the_new_k_and_epsilon(deployment, style):
    deployed_flow = DEPLOYMENTS[deployment]
    payload = submitted(deployed_flow, deployment, style, edit={"k": 7, "epsilon": 0.5})
    parameters = as_the_server_and_worker_take_it(deployed_flow, payload)
    spec = parameters["spec"] if "spec" in parameters else parameters["request"].spec
    assert (spec.k, spec.epsilon) == (7, 0.5)


def test_the_old_schema_s_untouched_form_would_have_been_refused():
    # The failure this guards against: a null default in a schema whose type excludes null.
    schema = run_form_schema()
    schema["definitions"]["ReleaseSpec"]["properties"]["operator"]["default"] = None
    payload = submitted(governed_release, "paper-synthetic-nightly", "omitted")
    payload["spec"]["operator"] = None
    with pytest.raises(Exception, match="spec.operator"):
        validate(hydrate(payload, HydrationContext(raise_on_error=True)), schema, raise_on_error=True)


def test_a_half_filled_dp_block_does_not_fail_a_run_in_the_methods_own_mode(synthetic_spec_dict):
    # What a form may send for the DP block left empty: an object whose fields are all empty.
    spec = parse_spec({**synthetic_spec_dict, "dp": {"sensitive_levels": {}, "beta": None, "node": {}, "search": None}})
    assert spec.dp is None
    # A DP block with a value in it is a choice, and the method's own mode still refuses it by name.
    with pytest.raises(Exception, match="dp"):
        parse_spec({**synthetic_spec_dict, "dp": {"max_delta": 1e-6}})


def test_an_emptied_required_field_is_still_refused_by_name(synthetic_spec_dict):
    with pytest.raises(Exception, match="release_id"):
        parse_spec({**synthetic_spec_dict, "release_id": ""})


def ordered(definition: dict) -> list[str]:
    return sorted(definition["properties"], key=lambda name: definition["properties"][name]["position"])


def test_k_epsilon_release_id_and_source_come_first():
    release = run_form_schema(governed_release)["definitions"]
    assert ordered(release["ReleaseSpec"])[:4] == ["k", "epsilon", "release_id", "source"]
    advice = run_form_schema(advise)["definitions"]
    assert ordered(advice["AdviceRequest"])[:3] == ["k_values", "epsilon_values", "spec"]
    assert ordered(advice["ReleaseSpec"])[:4] == ["k", "epsilon", "release_id", "source"]


@pytest.mark.parametrize("deployed_flow", FLOWS, ids=lambda f: f.name)
def test_no_label_is_a_class_name(deployed_flow):
    schema = run_form_schema(deployed_flow)
    class_names = set(schema["definitions"])
    roots = {f"/definitions/{name}" for name in class_names}
    shown = [(path, node["title"]) for path, node in walk(schema) if isinstance(node.get("title"), str) and path not in roots]
    assert [(path, title) for path, title in shown if title in class_names] == []
    # A definition still titled by its class (a model of the engine's) is never shown: each reference names it.
    for name in class_names:
        if schema["definitions"][name].get("title") == name:
            references = [node for _, node in walk(schema) if node.get("$ref") == f"#/definitions/{name}"]
            assert all("title" in node for node in references), name
    assert not [t for _, t in shown if re.fullmatch(r"[A-Z][a-z]+(?:[A-Z][a-z]+)+", t)]


def test_required_fields_are_listed_as_required():
    definitions = run_form_schema()["definitions"]
    assert {"k", "epsilon", "release_id", "source", "population_id", "roles"} <= set(definitions["ReleaseSpec"]["required"])
    assert {"column", "hierarchy"} <= set(definitions["KQuasi"]["required"])
    assert {"column", "lower", "upper"} <= set(definitions["EQuasi"]["required"])
    assert "path" in definitions["SourceSpec"]["required"]


@pytest.mark.parametrize("deployed_flow", FLOWS, ids=lambda f: f.name)
def test_every_description_survives_the_forms_sanitiser(deployed_flow):
    schema = run_form_schema(deployed_flow)
    descriptions = [node["description"] for _, node in walk(schema) if isinstance(node.get("description"), str)]
    assert len(descriptions) > 20
    assert [d for d in descriptions if "<" in d or ">" in d] == []


@pytest.mark.parametrize("deployed_flow", FLOWS, ids=lambda f: f.name)
def test_only_optional_blocks_offer_a_not_used_choice(deployed_flow):
    schema = run_form_schema(deployed_flow)
    nullable = {
        path.rsplit("/", 1)[-1]: node
        for path, node in walk(schema)
        if any(isinstance(option, dict) and option.get("type") == "null" for option in node.get("anyOf", []))
    }
    # Spec models added later get the same treatment: the test names the blocks known today as a floor.
    assert {"dp", "search", "l_diversity", "t_closeness"} <= set(nullable)
    for node in nullable.values():
        assert node["anyOf"][0] == {"type": "null", "title": NOT_USED} and node["default"] is None
    # No plain field carries a null default (both UIs would send it, and its type excludes null).
    nulls = [path for path, node in walk(schema) if node.get("default", 0) is None and "anyOf" not in node]
    assert nulls == []


def test_optional_fields_still_accept_being_left_empty(synthetic_spec_dict):
    # Hiding null from the form must not make the fields required: an omitted value keeps its default.
    spec = parse_spec({**synthetic_spec_dict, "operator": None, "max_prosecutor_risk": None})
    assert spec.operator is None and spec.source.format is None
    spec = parse_spec({**synthetic_spec_dict, "operator": "", "output_dir": ""})
    assert spec.operator is None and spec.output_dir == "out"
    assert "operator" not in json.dumps(run_form_schema()["required"])
