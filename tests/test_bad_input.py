"""Bad input and settings (issue 24, item 4): one line naming the column, option or variable, exit 2,
nothing spent, never a traceback; and the same-id claim (item 5).

The fast part: the CLI driven in-process (Typer's runner) where no Prefect server is needed, and the
layers that validate (reader, spec, ledger). The whole matrix through the real ``kepsilon`` command
against a real Prefect server is ``reliability/scenarios.py``'s bad-settings block (``make reliability``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

import kepsilon.cli as cli_module
from kepsilon.audit.claims import ReleaseInProgress, claim_file, release_claim
from kepsilon.audit.ledger import budget, reserve, set_cap
from kepsilon.audit.store import open_store
from kepsilon.cli import app
from kepsilon.flows.spec import SourceSpec, parse_spec
from kepsilon.tasks.errors import InputError, SpecError
from kepsilon.tasks.ingest import read_source
from kepsilon.tasks.sources import plan_source, read_piece

from .conftest import ADULT, SYNTHETIC

runner = CliRunner()
ABSURD = ("1e10", "1e308", "inf", "nan", "-1", "0", "abc")


def one_line(output: str) -> str:
    """The output's single non-empty line; fails when there are more (a traceback, a panel)."""
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1, output
    assert "Traceback" not in output
    return lines[0]


def not_quoted(line: str, value: str) -> bool:
    """The line does not repeat the value (short numbers like 0 or 1 may occur in the rule itself, unquoted)."""
    if value.lstrip("-").isdigit() and len(value.lstrip("-")) == 1:
        return f"'{value}'" not in line
    return value.lower() not in line.lower().replace("kepsilon", "")


def ledger_rows(store: Path) -> list[tuple]:
    if not store.exists():
        return []
    return open_store(store).execute("SELECT kind, population_id FROM ledger").fetchall()


# --- malformed Parquet --------------------------------------------------------------------------


def _invalid_utf8_strings(values: list[bytes]) -> pa.StringArray:
    """A string column whose bytes are stored as given (Arrow checks UTF-8 only when asked)."""
    data = b"".join(values)
    offsets = [0]
    for value in values:
        offsets.append(offsets[-1] + len(value))
    return pa.StringArray.from_buffers(len(values), pa.array(offsets, pa.int32()).buffers()[1], pa.py_buffer(data))


def write_bad_text_parquet(path: Path) -> Path:
    table = pa.table({"AGE": [30, 40, 50], "NAME": _invalid_utf8_strings([b"Anna", b"B\xffb", b"Carl"])})
    pq.write_table(table, path)
    return path


def test_parquet_text_that_is_not_utf8_is_refused_naming_the_column(tmp_path):
    path = write_bad_text_parquet(tmp_path / "bad.parquet")
    with pytest.raises(InputError) as refused:
        read_source(SourceSpec(path=str(path)))
    assert refused.value.column == "NAME" and "UTF-8" in str(refused.value)
    assert "B" not in str(refused.value).replace("Parquet", "")  # no value quoted


def test_the_dask_engine_s_parquet_pieces_refuse_it_the_same_way(tmp_path):
    source = SourceSpec(path=str(write_bad_text_parquet(tmp_path / "bad.parquet")))
    plan = plan_source(source, 1)
    with pytest.raises(InputError) as refused:
        read_piece(plan, plan.pieces[0], source)
    assert refused.value.column == "NAME"


def test_valid_parquet_text_still_reads(tmp_path):
    path = tmp_path / "good.parquet"
    pq.write_table(pa.table({"NAME": ["Anna", "Zoë", "李"]}), path)
    assert read_source(SourceSpec(path=str(path))).frame["NAME"].tolist() == ["Anna", "Zoë", "李"]


# --- the DP mode's max_delta is named by its spec path --------------------------------------------


def _dp_spec(max_delta) -> dict:
    return {
        "release_id": "dp-release",
        "population_id": "dp-population",
        "source": {"path": str(ADULT / "adult.csv"), "delimiter": ";"},
        "roles": {
            "explicit": ["native-country", "workclass", "occupation"],
            "k_quasi": [{"column": c, "hierarchy": str(ADULT / f"adult_hierarchy_{c}.csv")}
                        for c in ["sex", "race", "marital-status", "education"]],
            "e_quasi": [{"column": "age", "lower": 17, "upper": 90, "hierarchy": str(ADULT / "adult_hierarchy_age.csv")}],
            "sensitive": ["salary-class"],
        },
        "k": 30,
        "epsilon": 1.0,
        "privacy_model": "dp",
        "output_dir": "/tmp/unused",
        "dp": {"max_delta": max_delta, "node": {"sex": 0, "race": 1, "marital-status": 1, "education": 2, "age": 2}},
    }


@pytest.mark.parametrize("max_delta", [0, 1, 1.5, -1, 1e308, float("inf"), float("nan"), "abc"])
def test_dp_max_delta_is_named_dp_max_delta(max_delta):
    with pytest.raises(SpecError) as refused:
        parse_spec(_dp_spec(max_delta))
    assert refused.value.parameter == "dp.max_delta"
    assert "function-after" not in str(refused.value)


# --- caps: the ledger's integer units, δ below 1 --------------------------------------------------


def _set_cap(store: Path, *args: str):
    # ``--`` as a user would type it before a negative number
    return runner.invoke(app, ["audit", "--db", str(store), "set-cap", "--by", "officer", "--reason", "test", *args])


@pytest.mark.parametrize("cap", ABSURD)
def test_absurd_caps_are_refused_by_name_and_record_nothing(tmp_path, cap):
    store = tmp_path / "audit.db"
    result = _set_cap(store, "--", "P", cap)
    line = one_line(result.output)
    assert result.exit_code == 2 and "cap" in line.lower() and not_quoted(line, cap), line
    assert ledger_rows(store) == []


def test_the_largest_cap_the_ledger_holds_is_accepted(tmp_path):
    store = tmp_path / "audit.db"
    result = _set_cap(store, "P", "1e9")
    assert result.exit_code == 0, result.output
    assert budget(open_store(store), "P")["cap"] == 10**18


@pytest.mark.parametrize("delta", ["1", "2", "1e10", "1e308", "inf", "nan", "-1", "0", "abc"])
def test_delta_caps_outside_0_1_are_refused_by_name(tmp_path, delta):
    store = tmp_path / "audit.db"
    result = _set_cap(store, "--delta", delta, "P", "1")
    line = one_line(result.output)
    assert result.exit_code == 2 and "delta" in line and not_quoted(line, delta), line
    assert ledger_rows(store) == []


def test_a_delta_cap_below_1_is_kept(tmp_path):
    store = tmp_path / "audit.db"
    assert _set_cap(store, "--delta", "0.5", "P", "1").exit_code == 0
    assert budget(open_store(store), "P")["delta_cap"] == 5 * 10**17


@pytest.mark.parametrize("value", ABSURD[:2] + ABSURD[2:])
def test_an_absurd_default_cap_is_refused_by_its_variable_before_anything_is_reserved(tmp_path, monkeypatch, value):
    monkeypatch.setenv("KEPSILON_DEFAULT_CAP", value)
    db = open_store(tmp_path / "audit.db")
    with pytest.raises(SpecError) as refused:
        reserve(db, population_id="P", epsilon=1.0, idempotency_key="k", release_id="r", operator="op")
    assert refused.value.parameter == "KEPSILON_DEFAULT_CAP" and value not in refused.value.problem
    assert ledger_rows(tmp_path / "audit.db") == []


def test_an_epsilon_beyond_the_ledger_is_refused_by_name_before_anything_is_reserved(tmp_path):
    db = open_store(tmp_path / "audit.db")
    set_cap(db, "P", 1e9, "officer", "largest")
    with pytest.raises(SpecError) as refused:
        reserve(db, population_id="P", epsilon=1e10, idempotency_key="k", release_id="r", operator="op")
    assert refused.value.parameter == "epsilon"
    assert [kind for kind, _ in ledger_rows(tmp_path / "audit.db")] == ["cap"]


@pytest.mark.parametrize("value", ["1e308", "inf", "nan", "-1", "0", "abc"])
def test_an_absurd_busy_timeout_is_refused_by_its_variable(tmp_path, monkeypatch, value):
    open_store(tmp_path / "audit.db").close()
    monkeypatch.setenv("KEPSILON_AUDIT_BUSY_TIMEOUT", value)
    result = runner.invoke(app, ["audit", "--db", str(tmp_path / "audit.db"), "budget", "P"])
    line = one_line(result.output)
    assert result.exit_code == 2 and "KEPSILON_AUDIT_BUSY_TIMEOUT" in line, line


# --- every CLI option, absurd values: one line naming it, or accepted ---------------------------


@pytest.fixture
def no_prefect(monkeypatch):
    """Fail at once, instead of starting a Prefect server, if a release gets past the CLI's validation."""

    def reached(*args, **kwargs):
        raise RuntimeError("the release got past validation to the Prefect API")

    monkeypatch.setattr(cli_module, "_prefect_api", reached)


RELEASE_SPEC = SYNTHETIC.parent.parent / "releases" / "paper-synthetic.yaml"
# What the CLI and the spec refuse before anything runs; --epsilon 1e10 and 1e308 pass the spec and are
# refused by the ledger at the reservation, before anything is reserved (the reliability matrix runs them).
REFUSED_RELEASE_OPTIONS = (
    [("--k", value) for value in ABSURD]
    + [("--epsilon", value) for value in ("inf", "nan", "-1", "0", "abc")]
    + [("--algorithm", value) for value in ABSURD]
)


@pytest.mark.parametrize("option, value", REFUSED_RELEASE_OPTIONS)
def test_release_options_refuse_absurd_values_in_one_line(tmp_path, monkeypatch, no_prefect, option, value):
    monkeypatch.setenv("KEPSILON_AUDIT_DB", str(tmp_path / "audit.db"))
    result = runner.invoke(app, ["release", str(RELEASE_SPEC), option, value])
    line = one_line(result.output)
    assert result.exit_code == 2, line
    assert option.strip("-").replace("-", "_") in line.replace("-", "_"), line
    assert not_quoted(line, value), line
    assert ledger_rows(tmp_path / "audit.db") == []


@pytest.mark.parametrize("field", ["release_id", "operator"])
@pytest.mark.parametrize("value", ["1e10", "nan", "inf", "0", "abc"])
def test_any_text_is_a_release_id_or_an_operator(field, value):
    from kepsilon.flows.spec import load_spec

    assert getattr(load_spec(RELEASE_SPEC, **{field: value}), field) == value


ADVISE_OPTIONS = {"--k": ("--epsilon", "1"), "--epsilon": ("--k", "2"), "--draws": ("--k", "2"),
                  "--target-error": ("--k", "2"), "--max-linking-risk": ("--k", "2")}
ADVISE_PARAMETER = {"--k": "k", "--epsilon": "epsilon", "--draws": "draws", "--target-error": "target_error",
                    "--max-linking-risk": "max_linking_risk"}


@pytest.fixture(scope="module")
def small_spec(tmp_path_factory) -> Path:
    """The shipped spec on its first 300 records (the advisor's accepted cases then take a second)."""
    import yaml

    from .conftest import release_spec_dict

    folder = tmp_path_factory.mktemp("small")
    lines = (SYNTHETIC / "people.csv").read_text(encoding="utf-8").splitlines(keepends=True)[:301]
    (folder / "people.csv").write_text("".join(lines), encoding="utf-8")
    spec = release_spec_dict("paper-synthetic", source={"path": str(folder / "people.csv"), "delimiter": ";"},
                             output_dir=str(folder / "out"))
    path = folder / "spec.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False, allow_unicode=True), encoding="utf-8")
    return path


@pytest.mark.parametrize("option", ADVISE_OPTIONS)
@pytest.mark.parametrize("value", ["1e10", "1e308", "inf", "nan", "-1", "0", "abc"])
def test_advise_options_refuse_absurd_values_in_one_line_or_accept_them(tmp_path, monkeypatch, small_spec, option, value):
    monkeypatch.setenv("KEPSILON_REPORTS_DIR", str(tmp_path / "reports"))
    store = tmp_path / "audit.db"
    result = runner.invoke(app, ["advise", str(small_spec), "--db", str(store), "--draws", "2", *ADVISE_OPTIONS[option], option, value])
    assert "Traceback" not in result.output
    if result.exit_code == 0:  # a target of 0 risk: answered (no cell meets it), nothing spent
        assert (option, value) == ("--max-linking-risk", "0"), result.output[-300:]
    else:
        line = one_line(result.output)
        assert result.exit_code == 2 and (ADVISE_PARAMETER[option] in line or option in line), line
        assert not_quoted(line, value), line
    assert [kind for kind, _ in ledger_rows(store)] == []


@pytest.mark.parametrize("args", [["--min-k", "abc"], ["--min-k", "1e10"], ["--max-epsilon", "abc"]])
def test_audit_policy_options_refuse_in_one_line(tmp_path, args):
    result = runner.invoke(app, ["audit", "--db", str(tmp_path / "audit.db"), "policy", *args])
    line = one_line(result.output)
    assert result.exit_code == 2 and args[0] in line and args[1] not in line, line


def test_init_refuses_bad_parquet_naming_the_column(tmp_path):
    path = write_bad_text_parquet(tmp_path / "bad.parquet")
    result = runner.invoke(app, ["init", str(path), "-o", str(tmp_path / "spec.yaml")])
    line = one_line(result.output)
    assert result.exit_code == 2 and "NAME" in line and "UTF-8" in line, line
    assert not (tmp_path / "spec.yaml").exists()


def test_an_immutable_dask_scratch_folder_is_refused_by_name(tmp_path, synthetic_spec_dict):
    from kepsilon.flows.release_dask import _prepare_scratch
    from reliability.harness import make_unwritable

    folder = tmp_path / "scratch"
    folder.mkdir()
    spec = parse_spec({**synthetic_spec_dict, "execution": {"engine": "dask", "scratch": str(folder)}})
    undo = make_unwritable(folder)
    if undo is None:
        pytest.skip("neither mode 0555 nor chattr +i stops writes here")
    try:
        with pytest.raises(SpecError) as refused:
            _prepare_scratch(spec, str(tmp_path / "out"), 1000)
    finally:
        undo()
    assert refused.value.parameter == "execution.scratch"


# --- same-id claims ------------------------------------------------------------------------------


def test_a_release_claim_held_by_a_live_run_refuses_a_second_one(tmp_path):
    store = tmp_path / "audit.db"
    with release_claim(store, "r1"):
        with pytest.raises(ReleaseInProgress, match="'r1' is already being published by another run"):
            with release_claim(store, "r1"):
                pass
        with release_claim(store, "r2"):  # another release id is free
            pass
    with release_claim(store, "r1"):  # released at the end of the block
        pass
    folder = claim_file(store, "r1").parent
    assert oct(folder.stat().st_mode & 0o777) == "0o700"
    assert oct(claim_file(store, "r1").stat().st_mode & 0o777) == "0o600"


def test_a_claim_whose_owner_was_killed_is_free(tmp_path):
    store = tmp_path / "audit.db"
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time\nfrom kepsilon.audit.claims import release_claim\n"
         f"with release_claim({str(store)!r}, 'r1'):\n    print('held', flush=True)\n    time.sleep(60)\n"],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(ReleaseInProgress):
            with release_claim(store, "r1"):
                pass
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=10)
        with release_claim(store, "r1"):  # the kernel dropped the dead owner's lock
            pass
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()


# --- the two privacy models: a field of the other one is refused whatever its value ------------


@pytest.mark.parametrize(
    "spec_file, stated, parameter",
    [
        ("adult-dp.yaml", "confidence: 0.99\n", "confidence"),  # the method's default, stated in a DP spec
        ("adult-dp.yaml", "algorithm: mondrian\n", "algorithm"),
        ("paper-synthetic.yaml", "dp: {max_delta: 0.001, node: {YOB: 0}}\n", "dp"),
    ],
)
def test_a_field_of_the_other_privacy_model_is_refused_by_the_cli_in_one_line(
    tmp_path, monkeypatch, no_prefect, spec_file, stated, parameter
):
    monkeypatch.setenv("KEPSILON_AUDIT_DB", str(tmp_path / "audit.db"))
    shipped = RELEASE_SPEC.parent / spec_file
    (tmp_path / "data").symlink_to(shipped.parent.parent / "data")  # the shipped spec's ../data paths hold
    (tmp_path / "releases").mkdir()
    spec = tmp_path / "releases" / spec_file
    spec.write_text(shipped.read_text(encoding="utf-8") + stated, encoding="utf-8")
    result = runner.invoke(app, ["release", str(spec)])
    line = one_line(result.output)
    assert result.exit_code == 2, line
    assert f"'{parameter}'" in line and "privacy_model" in line and "Traceback" not in result.output, line
    assert ledger_rows(tmp_path / "audit.db") == []


# --- the head log's setting: named, never its value ---------------------------------------------


@pytest.mark.parametrize("value", ["1e10", "nan"])
@pytest.mark.parametrize("command", [["budget", "P"], ["verify"]])
def test_an_absurd_head_log_setting_is_named_not_repeated(tmp_path, monkeypatch, value, command):
    """KEPSILON_AUDIT_HEAD_LOG=1e10 names a file that is not the store's log: the refusal (and verify's report)
    names the variable, never the value typed (it used to say "its head log '1e10' is missing")."""
    monkeypatch.chdir(tmp_path)  # the value, a relative path, lands here
    store = tmp_path / "store" / "audit.db"
    set_cap(open_store(store), "P", 1.0, "officer", "a store with chain entries")
    monkeypatch.setenv("KEPSILON_AUDIT_HEAD_LOG", value)
    result = runner.invoke(app, ["audit", "--db", str(store), *command])
    assert result.exit_code == 2, result.output
    assert "KEPSILON_AUDIT_HEAD_LOG" in result.output and "Traceback" not in result.output
    assert not_quoted(result.output, value), result.output
    if command[0] == "budget":
        one_line(result.output)
