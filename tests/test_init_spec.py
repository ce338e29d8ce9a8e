"""``kepsilon init DATA.csv``: the starter spec, run as the README's quick start ("Your own data") runs it.

The table is generated at test time (``tests/patients.py``, issue 22's 4,000 patients); the project
ships no such file. Expected roles are written out by hand from what the columns are.
"""

import os
import re
import stat
import subprocess
from pathlib import Path

import pandas as pd
import pytest
import yaml

from kepsilon.flows.spec import load_spec
from kepsilon.init_spec import InitRefused, write_starter_spec

from .conftest import ROOT
from .patients import patients, write_patients_csv

KEPSILON = str(ROOT / ".venv" / "bin" / "kepsilon") if (ROOT / ".venv" / "bin" / "kepsilon").exists() else "kepsilon"


def _env(work: Path) -> dict:
    env = {**os.environ, "PREFECT_HOME": str(work / "prefect"), "KEPSILON_AUDIT_DB": str(work / "audit.db"),
           "KEPSILON_SEED_KEY_FILE": str(work / "seed.key"), "KEPSILON_REPORTS_DIR": str(work / "reports"),
           "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120", "DO_NOT_TRACK": "1"}
    for name in ("PREFECT_API_URL", "KEPSILON_DEFAULT_CAP", "KEPSILON_SEED_KEY", "KEPSILON_FAULT_AT"):
        env.pop(name, None)
    return env


def _kepsilon(work: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([KEPSILON, *args], cwd=work, env=_env(work), capture_output=True, text=True, timeout=600)


def _roles(spec) -> dict:
    roles = spec.roles
    return {
        "explicit": roles.explicit,
        "k_quasi": {q.column: q.hierarchy.model_dump(mode="json", exclude_none=True) for q in roles.k_quasi},
        "e_quasi": {q.column: (q.lower, q.upper) for q in roles.e_quasi},
        "sensitive": roles.sensitive,
    }


@pytest.fixture(scope="module")
def walked(tmp_path_factory):
    """`kepsilon init patients.csv` in a fresh folder, as the README says; run twice (the second refused)."""
    work = tmp_path_factory.mktemp("own-data")
    write_patients_csv(work / "patients.csv")
    first = _kepsilon(work, "init", "patients.csv")
    written = (work / "patients.yaml").read_bytes()
    second = _kepsilon(work, "init", "patients.csv")
    return work, first, written, second


def test_init_writes_a_spec_that_loads_with_the_expected_roles(walked):
    work, first, _, _ = walked
    assert first.returncode == 0, first.stderr
    spec = load_spec(work / "patients.yaml")
    assert _roles(spec) == {
        "explicit": ["email"],  # the release's own detector: its values look like e-mail addresses
        "k_quasi": {
            "age": {"kind": "intervals", "lower": 0, "upper": 100, "widths": [5, 10, 20]},  # 18..95 rounded outward
            "sex": {"kind": "categories"},
            "zip": {"kind": "masking", "length": 5, "mask": "*"},
        },
        "e_quasi": {"income": (0, 2_000_000)},  # 0..1,002,300 rounded outward to a multiple of 10⁶
        "sensitive": ["diagnosis"],
    }
    assert spec.k == 20 and spec.epsilon == 1.0
    assert spec.population_id == "patients" and spec.release_id == "patients-{date}"
    assert Path(spec.source.path) == work / "patients.csv"
    assert Path(spec.output_dir) == work / "out"
    assert stat.S_IMODE((work / "patients.yaml").stat().st_mode) == 0o600  # its bounds are private until replaced


def test_the_spec_marks_every_bound_read_from_the_data_and_says_the_next_steps(walked):
    work, first, _, _ = walked
    text = (work / "patients.yaml").read_text(encoding="utf-8")
    marked = [line for line in text.splitlines() if "replace with public bounds" in line and not line.startswith("#")]
    assert [line.split(":")[0].strip(" -") for line in marked] == ["hierarchy", "lower", "upper"]
    assert all("private" in line for line in marked)
    assert '#        kepsilon audit set-cap patients 5 --by "YOUR NAME" --reason "WHY"' in text
    assert "# " in text and "kepsilon check patients.yaml" in text and "kepsilon release patients.yaml" in text
    # The terminal: each column's role, then the steps; nothing of the data itself.
    assert "email      explicit   its values look like e-mail addresses" in first.stdout
    assert "income     e_quasi    numbers: kept, with noise per group; a long tail of large values" in first.stdout
    assert 'kepsilon audit set-cap patients 5 --by "YOUR NAME" --reason "WHY"' in first.stdout
    for value in ("02419", "1002300", "@", "I10"):
        assert value not in first.stdout and value not in text


def test_init_never_overwrites_a_spec(walked):
    work, _, written, second = walked
    assert second.returncode == 2
    assert second.stdout == ""
    assert second.stderr.strip().splitlines() == [
        f"init refused: {work / 'patients.yaml'} already exists; init never overwrites a spec (choose another with -o)"
    ]
    assert (work / "patients.yaml").read_bytes() == written
    assert sorted(p.name for p in work.iterdir() if p.name.startswith(".")) == []  # no temporary file left


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    missing = _kepsilon(tmp_path, "init", "nowhere.csv")
    assert missing.returncode == 2 and len(missing.stderr.strip().splitlines()) == 1
    assert missing.stderr.startswith("init refused:") and "nowhere.csv" in missing.stderr
    assert "Traceback" not in missing.stderr and not (tmp_path / "nowhere.yaml").exists()


def test_a_spec_elsewhere_points_back_at_the_data(tmp_path):
    data = write_patients_csv(tmp_path / "data" / "patients.csv", rows=500)
    (tmp_path / "specs").mkdir()
    starter = write_starter_spec(data, tmp_path / "specs" / "q4.yaml")
    spec = load_spec(tmp_path / "specs" / "q4.yaml")
    assert Path(spec.source.path) == data
    assert 'source: {path: "../data/patients.csv"}' in starter.text
    assert spec.k == 20  # 500 records: still 20 (at most a twentieth of the records)
    with pytest.raises(InitRefused, match="does not exist"):
        write_starter_spec(data, tmp_path / "absent" / "q4.yaml")


def test_parquet_with_typed_columns(tmp_path):
    frame = patients(rows=1000, seed=3)
    frame["age"] = frame["age"].astype("int64")
    frame["income"] = frame["income"].astype("float64")
    frame.to_parquet(tmp_path / "patients.parquet", index=False)
    write_starter_spec(tmp_path / "patients.parquet", tmp_path / "spec.yaml")
    roles = _roles(load_spec(tmp_path / "spec.yaml"))
    assert roles["explicit"] == ["email"]
    assert list(roles["k_quasi"]) == ["age", "sex", "zip"]
    assert roles["k_quasi"]["age"]["kind"] == "intervals"
    assert list(roles["e_quasi"]) == ["income"]
    assert roles["sensitive"] == ["diagnosis"]


def test_other_shapes_of_columns(tmp_path):
    """Record numbers, names, phones, dates, flags, free text, empty cells, names YAML must quote."""
    rows = 600
    frame = pd.DataFrame({
        "PatientNo": [str(1000 + i) for i in range(rows)],  # consecutive: a record number
        "full name": [f"Person {i % 97}" for i in range(rows)],  # a name, by its name
        "contact": [f"+353 1 {200 + i % 700} {1000 + i}" for i in range(rows)],  # phone numbers
        "admitted": [f"2025-{1 + i % 12:02d}-{1 + i % 28:02d}" for i in range(rows)],
        "smoker": [str(i % 2) for i in range(rows)],  # a number with two values: categories
        "notes": [f"seen by the nurse on ward {i % 9}, follow up in {i % 5} weeks" for i in range(rows)],
        "blood group": [["A+", "O+", "B-", "AB+"][i % 4] for i in range(rows)],
        "yes": [["", "x"][i % 2] for i in range(rows)],  # empty cells: cannot be a quasi
        "weight": [f"{50 + (i * 7) % 60}.{i % 10}" for i in range(rows)],  # decimals: an ε-quasi
        "treatment": [["none", "statin", "insulin"][i % 3] for i in range(rows)],
        "member": [f"{(i * 7919) % 1_000_000_000:09d}" for i in range(rows)],  # unique 9-digit codes
    })
    frame.to_csv(tmp_path / "ward.csv", sep=";", index=False)
    starter = write_starter_spec(tmp_path / "ward.csv", tmp_path / "ward.yaml")
    spec = load_spec(tmp_path / "ward.yaml")
    roles = _roles(spec)
    assert roles["explicit"] == ["PatientNo", "full name", "contact", "notes", "member"]
    assert roles["k_quasi"] == {
        "admitted": {"kind": "dates", "format": "%Y-%m-%d", "levels": ["month", "year", "decade"]},
        "smoker": {"kind": "categories"},
        "blood group": {"kind": "categories"},
    }
    assert list(roles["e_quasi"]) == ["weight"]
    assert roles["sensitive"] == ["yes", "treatment"]
    assert spec.source.delimiter == ";"
    assert '- "yes"' in starter.text  # unquoted, YAML would read it as true


def test_a_table_with_nothing_to_generalise_is_refused(tmp_path):
    pd.DataFrame({"email": [f"p{i}@example.org" for i in range(200)]}).to_csv(tmp_path / "e.csv", index=False)
    with pytest.raises(InitRefused, match="no column can be a k-quasi"):
        write_starter_spec(tmp_path / "e.csv", tmp_path / "e.yaml")
    assert not (tmp_path / "e.yaml").exists()


@pytest.mark.heavy
def test_the_quick_start_publishes_at_the_first_release(tmp_path):
    """The README's quick start, every step a command: init, the bounds edited, set-cap, release."""
    write_patients_csv(tmp_path / "patients.csv")
    assert _kepsilon(tmp_path, "init", "patients.csv").returncode == 0
    text = (tmp_path / "patients.yaml").read_text(encoding="utf-8")
    text = text.replace("lower: 0, upper: 100, widths", "lower: 0, upper: 120, widths")  # public: ages 0-120
    text = text.replace("upper: 2000000   #", "upper: 5000000   #")  # public: the survey's top code
    (tmp_path / "patients.yaml").write_text(text, encoding="utf-8")
    capped = _kepsilon(tmp_path, "audit", "set-cap", "patients", "5", "--by", "H. Steward", "--reason", "test")
    assert capped.returncode == 0, capped.stderr
    released = _kepsilon(tmp_path, "release", "patients.yaml")
    assert released.returncode == 0, released.stderr
    passed = re.search(r"checks passed\W+(\d+)/(\d+)", released.stdout)
    assert passed is not None, released.stdout
    assert passed[1] == passed[2] and int(passed[2]) >= 8, released.stdout  # every expectation of the gate held
    folder = next((tmp_path / "out").iterdir())
    assert sorted(p.name for p in folder.iterdir()) == ["data.csv", "data.parquet", "manifest.json"]
    published = pd.read_csv(folder / "data.csv", dtype=str)
    assert list(published.columns) == ["age", "sex", "zip", "diagnosis", "income"]
    assert published.groupby(["age", "sex", "zip"]).size().min() >= 20
    manifest = yaml.safe_load((folder / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["hierarchies"]["sex"]["builder"]["kind"] == "categories"
