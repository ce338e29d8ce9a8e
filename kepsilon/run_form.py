"""How the flows' parameter models look as the Prefect UI's run form, and what they accept from it.

Prefect renders a deployment's "Custom run" form from the flow's parameter schema and both of its UIs (V2,
the default, and V1) initialise every field from the schema's ``default``. A field that pydantic writes as
``default: null`` in a schema whose type excludes null (our ``X | SkipJsonSchema[None]`` fields) made the
untouched form invalid; an optional sub-model (``dp``) was rendered open and sent half-filled. Every model
the form shows derives from :class:`FormModel`, whose schema hook (``form_schema``) fixes that generically,
so a field added later gets the same treatment:

- an optional field (default ``None``) has no ``default`` in the schema: the form leaves it empty and sends
  nothing (V2 drops an emptied text or number field from the payload);
- an optional sub-model (``dp``, ``search``, ``l_diversity``…) becomes a choice between "not used" (null,
  the default, so the block is collapsed) and the block itself;
- every field gets a ``position`` (the order both UIs sort fields by) with the class's ``form_first`` names
  first and ``form_last`` names last, and a title in a steward's words (never a class name);
- names in the class's ``form_required`` are listed as required (the model's validators require them, with
  a better message than "field required"), so the UI does not label them "(Optional)".

On the way in, :meth:`FormModel._empty_means_default` treats what a form sends for an empty optional field
(null, ``""``, an object whose fields are all empty) as absent, so the field keeps its default.
"""

import re
from typing import Any, ClassVar, get_args

from pydantic import BaseModel, ConfigDict, model_validator

# Labels in a steward's words, by "Model.field" or by field name (the first match wins); a field without
# one gets its name with the underscores as spaces ("max_linking_risk" → "Max linking risk").
FORM_TITLES = {
    "k": "k: smallest group size",
    "epsilon": "ε per record",
    "DPSearch.epsilon": "ε of the search",
    "release_id": "Release id",
    "population_id": "Population id (whose ε budget is spent)",
    "source": "Source data",
    "roles": "Column roles",
    "explicit": "Direct identifiers (removed)",
    "k_quasi": "k-quasi columns (generalised)",
    "e_quasi": "ε-quasi columns (noised)",
    "sensitive": "Sensitive columns (released as they are)",
    "lower": "Public lower bound",
    "upper": "Public upper bound",
    "privacy_model": "Privacy model",
    "dp": "DP mode settings (privacy model dp only)",
    "epsilon_share": "Share of ε",
    "acknowledge_identifier": "Identifier checks acknowledged",
    "l_diversity": "ℓ-diversity",
    "t_closeness": "t-closeness",
    "l": "ℓ",
    "max_delta": "Largest δ",
    "beta": "Sampling probability β",
    "node": "Fixed node (level per column)",
    "search": "DP search of the node",
    "ola_metric": "OLA metric",
    "output_dir": "Output folder",
    "execution": "Execution engine",
    "k_values": "k values to compare",
    "epsilon_values": "ε values to compare",
    "spec": "Release spec",
    "draws": "Noise draws per cell",
    "csv": "Also write data.csv",
    "population": "Population matched against (journalist and marketer risk)",
    "table": "Population table (CSV)",
    "weight_column": "Sampling-weight column",
    "certificate": "Officer's certificate settings",
    "utility_target": "Column a classifier predicts (utility)",
    "risk_threshold": "Re-identification risk counted as at risk",
    "suda_max_size": "Largest combination SUDA searches",
}

# Titles of the choices a union offers, by the referenced model's name, or by field name for its text choice.
OPTION_TITLES = {
    "IntervalHierarchy": "intervals builder",
    "MaskingHierarchy": "masking builder",
    "DateHierarchy": "dates builder",
    "CategoryHierarchy": "categories builder",
    "SensitiveColumn": "column with criteria",
}
TEXT_OPTION_TITLES = {"hierarchy": "hierarchy file", "sensitive": "column name"}
NOT_USED = "not used"


def humanise(name: str) -> str:
    """``max_linking_risk`` → ``Max linking risk``; ``IntervalHierarchy`` → ``interval hierarchy``."""
    if "_" in name or name.islower():
        words = name.replace("_", " ").strip()
        return words[:1].upper() + words[1:]
    return re.sub(r"(?<!^)(?=[A-Z])", " ", name).lower()


def _option_title(reference: str) -> str | None:
    """The title of a referenced model by its class name. At hook time a reference is pydantic's internal
    one (``kepsilon__…__IntervalHierarchy__1``), so the class name is looked for inside it."""
    return next((title for name, title in OPTION_TITLES.items() if re.search(rf"\b{name}\b|_{name}[-_]", reference)), None)


def _title_options(field_name: str, node: Any) -> None:
    """Give every choice of a union a title, so that no class name (or "string") is shown as one.

    A referenced model of our own shows its ``form_title``; the others are named through OPTION_TITLES.
    """
    if isinstance(node, list):
        for item in node:
            _title_options(field_name, item)
        return
    if not isinstance(node, dict):
        return
    if "$ref" in node and "title" not in node and (title := _option_title(node["$ref"])):
        node["title"] = title
    for key in ("anyOf", "oneOf"):
        for option in node.get(key, []):
            if isinstance(option, dict) and option.get("type") == "string" and "title" not in option:
                option["title"] = TEXT_OPTION_TITLES.get(field_name, "text")
    for key in ("items", "anyOf", "oneOf"):
        if key in node:
            _title_options(field_name, node[key])


def _holds_a_model(annotation: Any) -> bool:
    """Whether a field's type is (optionally) a model, i.e. a block of fields rather than one value."""
    if isinstance(annotation, type):
        return issubclass(annotation, BaseModel)
    return any(_holds_a_model(argument) for argument in get_args(annotation))


def _field_title(model: type[BaseModel], name: str) -> str:
    field = model.model_fields[name]
    return field.title or FORM_TITLES.get(f"{model.__name__}.{name}") or FORM_TITLES.get(name) or humanise(name)


def form_schema(schema: dict[str, Any], model: type[BaseModel]) -> None:
    """The model's JSON schema as the run form should render it (see the module's docstring)."""
    properties: dict[str, dict] = schema.get("properties", {})
    first = [name for name in getattr(model, "form_first", ()) if name in properties]
    last = [name for name in getattr(model, "form_last", ()) if name in properties and name not in first]
    order = first + [name for name in properties if name not in first and name not in last] + last
    for position, name in enumerate(order):
        prop = properties[name]
        prop["position"] = position
        field = model.model_fields.get(name)
        if field is None:
            continue
        prop["title"] = _field_title(model, name)
        if not field.is_required() and field.default is None:
            prop.pop("default", None)
            if "$ref" in prop and _holds_a_model(field.annotation):
                # An optional block: collapsed as "not used" unless chosen. The null choice is first so both
                # UIs select it for a null value.
                block = {"$ref": prop.pop("$ref"), "title": prop["title"]}
                prop["anyOf"] = [{"type": "null", "title": NOT_USED}, block]
                prop["default"] = None
        _title_options(name, prop)
    schema["properties"] = {name: properties[name] for name in order}
    required = set(schema.get("required", [])) | set(getattr(model, "form_required", ()))
    if required:
        schema["required"] = [name for name in order if name in required]
    schema["title"] = getattr(model, "form_title", None) or humanise(model.__name__)


def is_empty(value: Any) -> bool:
    """What a form sends for a field left empty: null, ``""``, or an object whose fields are all empty."""
    if value is None or value == "":
        return True
    return isinstance(value, dict) and all(is_empty(item) for item in value.values())


class FormModel(BaseModel):
    """A parameter model the run form renders: strict, with the form's schema hook and empty-means-default."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=form_schema)

    form_title: ClassVar[str | None] = None
    form_first: ClassVar[tuple[str, ...]] = ()
    form_last: ClassVar[tuple[str, ...]] = ()
    form_required: ClassVar[tuple[str, ...]] = ()

    @model_validator(mode="before")
    @classmethod
    def _empty_means_default(cls, data: Any) -> Any:
        # Only optional fields: an empty required field still fails, naming the field.
        if not isinstance(data, dict):
            return data
        optional = {name for name, field in cls.model_fields.items() if not field.is_required()}
        return {name: value for name, value in data.items() if not (name in optional and is_empty(value))}
