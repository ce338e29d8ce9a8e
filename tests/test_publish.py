"""Publication: staged files, manifest last with the data files' hashes, one rename, immutability, shuffling."""

import hashlib
import json
import os
import stat

import numpy as np
import pandas as pd
import pytest

from kepsilon.engine.assemble import assemble_release, shuffle_records
from kepsilon.tasks.publish import AlreadyPublished, publish, put_in_place, stage


def frame():
    return pd.DataFrame({"YOB": ["[1960-1969]"] * 4, "HEIGHT": [170.5, 180.25, 160.0, 175.0], "ICD": list("abcd")})


def test_publishes_three_files_with_matching_hashes(tmp_path):
    publication = publish(frame(), {"release_id": "r1"}, tmp_path)
    directory = tmp_path / "r1"
    assert sorted(p.name for p in directory.iterdir()) == ["data.csv", "data.parquet", "manifest.json"]
    manifest = json.loads((directory / "manifest.json").read_text())
    for name in ["data.csv", "data.parquet"]:
        digest = hashlib.sha256((directory / name).read_bytes()).hexdigest()
        assert manifest["outputs"][name] == digest == publication.outputs[name]
    assert pd.read_csv(directory / "data.csv").equals(frame())
    assert pd.read_parquet(directory / "data.parquet").equals(frame())


def test_nothing_overwrites_a_published_folder(tmp_path):
    publish(frame(), {"release_id": "r1"}, tmp_path)
    before = (tmp_path / "r1" / "data.csv").read_bytes()
    with pytest.raises(AlreadyPublished, match="r1"):
        publish(frame().head(2), {"release_id": "r1"}, tmp_path)
    with pytest.raises(AlreadyPublished, match="r1"):
        publish(frame(), {"release_id": "r1"}, tmp_path)  # a rerun of a published release is the flow's no-op
    assert (tmp_path / "r1" / "data.csv").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r1"]  # no staging folder left behind


def test_staging_creates_nothing_under_the_final_name_until_the_rename(tmp_path):
    publication = stage(frame(), {"release_id": "r3"}, tmp_path)
    assert not (tmp_path / "r3").exists()
    assert publication.staging.name.startswith(".") and (publication.staging / "manifest.json").exists()
    put_in_place(publication.staging, publication.directory)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r3"]


def test_an_interrupted_staging_is_replaced_not_reused(tmp_path):
    leftover = tmp_path / ".r4.staging"
    leftover.mkdir()
    (leftover / "data.csv").write_bytes(b"half-writ")
    publish(frame(), {"release_id": "r4"}, tmp_path)
    assert pd.read_csv(tmp_path / "r4" / "data.csv").equals(frame())
    assert not leftover.exists()


def test_published_files_are_readable_as_the_umask_says(tmp_path):
    old = os.umask(0o022)
    try:
        publish(frame(), {"release_id": "r5"}, tmp_path)
    finally:
        os.umask(old)
    directory = tmp_path / "r5"
    assert stat.S_IMODE(directory.stat().st_mode) == 0o755
    assert {p.name: stat.S_IMODE(p.stat().st_mode) for p in directory.iterdir()} == {
        "data.csv": 0o644, "data.parquet": 0o644, "manifest.json": 0o644}


def test_a_failed_write_leaves_nothing_under_the_final_name(tmp_path, monkeypatch):
    import kepsilon.tasks.publish as module

    def explode(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(module.os, "fsync", explode)
    with pytest.raises(OSError):
        publish(frame(), {"release_id": "r2", "idempotency_key": "k"}, tmp_path)
    assert not (tmp_path / "r2").exists()


def test_shuffle_is_a_permutation_and_refuses_others():
    order = np.random.default_rng(1).permutation(4)
    shuffled = shuffle_records(frame(), order)
    assert sorted(shuffled["ICD"]) == list("abcd") and shuffled["ICD"].tolist() == list(np.array(list("abcd"))[order])
    with pytest.raises(ValueError):
        shuffle_records(frame(), np.array([0, 0, 1, 2]))


def test_assemble_drops_removed_and_identifiers():
    kept = frame().assign(NAME=list("wxyz"), YOB=[1961, 1965, 1969, 1962])
    released = pd.DataFrame({"YOB": ["[1961-1969]"] * 4}, index=kept.index)
    noisy = kept.assign(HEIGHT=kept["HEIGHT"] + 1)
    removed = np.array([False, True, False, False])
    roles = {"explicit": ["NAME"], "k_quasi": ["YOB"], "e_quasi": ["HEIGHT"], "sensitive": ["ICD"]}
    out = assemble_release(released, kept, noisy, removed, np.array([3, 2, 1, 0]), roles)
    assert list(out.columns) == ["YOB", "HEIGHT", "ICD"]
    assert out["ICD"].tolist() == ["d", "c", "a"]
    assert out["HEIGHT"].tolist() == [176.0, 161.0, 171.5]
    assert set(out["YOB"]) == {"[1961-1969]"}
