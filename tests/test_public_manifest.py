"""The public field list is enforced: a field not on it is refused at publish, at any depth."""

from typing import Any

import pytest

from kepsilon.flows.manifest import PrivateFieldInPublicManifest, check_public_fields

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
