"""The public field list is enforced: a field not on it is refused at publish, at any depth. The list is
derived from the public manifest's type (``kepsilon.record.PublicManifest``), so it cannot drift from it."""

from typing import Any

import pytest
from typing_extensions import get_type_hints

from kepsilon.flows.manifest import PUBLIC_FIELDS, PrivateFieldInPublicManifest, check_public_fields
from kepsilon.record import PublicManifest, ReleaseRecord, allowed_fields

PUBLIC: dict[str, Any] = {
    "release_id": "r",
    "population_id": "p",
    "method": {"k": 5, "epsilon": 1.0, "e_quasi": {"HEIGHT": {"lower": 130, "upper": 210, "grid": 0.125}}},
    "records": {"in": 10, "removed": {"confidence_suppression_record_rule": 1}, "published": 9},
    "groups": {"published": 1, "smallest": 9},
}


def test_a_manifest_of_public_fields_passes_and_a_misplaced_one_does_not():
    # A public field is public only where the list puts it: the same name one level off is refused.
    assert check_public_fields(PUBLIC) is None
    with pytest.raises(PrivateFieldInPublicManifest, match=r"manifest\.records\.k"):
        check_public_fields({**PUBLIC, "records": {**PUBLIC["records"], "k": 5}})


@pytest.mark.parametrize(
    "leak, where",
    [
        ({"source_sha256": "ab"}, "manifest.source_sha256"),
        ({"idempotency_key": "ab"}, "manifest.idempotency_key"),
        ({"method": {**PUBLIC["method"], "predicted_relative_error": 0.2}}, "manifest.method.predicted_relative_error"),
        ({"records": {**PUBLIC["records"], "clamped": 3}}, "manifest.records.clamped"),
        ({"groups": {**PUBLIC["groups"], "max_width": 3.5}}, "manifest.groups.max_width"),
        ({"groups": 4}, "manifest.groups must be a mapping"),
    ],
)
def test_a_private_field_is_refused_by_name(leak, where):
    with pytest.raises(PrivateFieldInPublicManifest, match=where.replace(".", r"\.")):
        check_public_fields({**PUBLIC, **leak})


# The list as it was written by hand before it was derived from PublicManifest: the type must give exactly this.
HAND_WRITTEN_PUBLIC_FIELDS = {
    "release_id": None,
    "population_id": None,
    "method": {
        "name": None, "k": None, "epsilon": None, "epsilon_split": "*", "algorithm": None, "ola_metric": None,
        "confidence": None, "confidence_suppression": None, "suppression_budget": None, "scale_basis": None,
        "mechanism": None, "privacy_unit": None, "e_quasi": "*", "sensitive_criteria": "*", "max_linking_risk": None,
        "max_prosecutor_risk": None, "privacy_model": None, "neighbouring_relation": None,
        "dp": {
            "epsilon_search": None, "epsilon_anonymisation": None, "beta": None, "beta_chosen_by": None, "delta": None,
            "max_delta": None, "node": "*", "node_chosen_by": None, "search_strategy": None, "search_steps": None,
            "sensitive_levels": "*",
        },
    },
    "roles": "*",
    "columns": "*",
    "hierarchies": "*",
    "guarantee": None,
    "records": {"in": None, "removed": "*", "published": None},
    "groups": {"published": None, "smallest": None},
    "outputs": "*",
    "software": "*",
    "checks": None,
    "unprotected_statistics": "*",
    "audit_chain": {"entries": None, "head_hash": None},
}


def test_the_public_field_list_is_the_public_manifests_type():
    assert PUBLIC_FIELDS == allowed_fields(PublicManifest) == HAND_WRITTEN_PUBLIC_FIELDS
    # A mapping-valued field allows any keys below it; a nested TypedDict lists its own; anything else is a leaf.
    assert PUBLIC_FIELDS["method"]["dp"]["node"] == "*"  # dict[str, int] | None
    assert PUBLIC_FIELDS["records"]["in"] is None
    assert PUBLIC_FIELDS["audit_chain"]["head_hash"] is None
    assert PUBLIC_FIELDS["checks"] is None  # a list: its entries are not checked key by key


PRIVATE_ONLY = sorted(set(get_type_hints(ReleaseRecord)) - set(get_type_hints(PublicManifest)))


def test_the_record_has_private_fields_the_manifest_does_not():
    assert {"idempotency_key", "source", "content_key", "linking_risk", "seed_commitment", "execution"} <= set(PRIVATE_ONLY)


@pytest.mark.parametrize("key", PRIVATE_ONLY)
def test_a_field_of_the_record_that_the_manifest_type_lacks_is_refused(key):
    """A key the private record has and ``PublicManifest`` does not is refused at publish, whatever it holds."""
    with pytest.raises(PrivateFieldInPublicManifest, match=rf"manifest\.{key} is not a public field"):
        check_public_fields({**PUBLIC, key: 1})
