"""Checks that need no noise and run before ε is reserved: the release id, and where the files will go.

A release must not fail after its noise is drawn for a reason that could be known earlier. So before
the reservation the flow asks the audit store whether the release id is already published (the same
logical release: a rerun that has nothing to do; another one: refused), and checks the output folder:
it is, or can be made, a writable folder, on a file system with room for twice the expected output,
and the process's file-size limit (``ulimit -f``) admits the expected data file. Nothing is created
under the release's final name here.
"""

import json
import os
import resource
import shutil
import sqlite3
import tempfile
from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from kepsilon.audit.errors import unavailable
from kepsilon.audit.store import open_store
from kepsilon.record import ReleaseRecord

from .errors import SpecError
from .publish import (
    AlreadyPublished,
    put_in_place,
    refuse_existing,
    release_directory,
    staged_outputs,
    staging_directory,
)

# The room asked for, as a multiple of the expected output: staging and a rerun's re-staging may
# briefly coexist with the leftovers of an interrupted attempt.
ROOM_FACTOR = 2


def expected_output_bytes(source_bytes: int) -> tuple[int, int]:
    """(largest file, all files) a release of a source of ``source_bytes`` is expected to write.

    The published CSV holds fewer columns than the source (identifiers removed) and generalised or
    rounded values, so it is taken as at most the source's size; the Parquet file, compressed, the
    same again at most; the manifest is a few kilobytes.
    """
    per_file = max(int(source_bytes), 1) + 64 * 1024
    return per_file, 2 * per_file


def _nearest_existing(path: Path) -> Path:
    for candidate in (path, *path.parents):
        if candidate.exists() or candidate.is_symlink():
            return candidate
    return Path(path.anchor or ".")


def check_output_dir(output_dir: str | Path, release_id: str, source_bytes: int) -> Path:
    """Refuse (``SpecError('output_dir')``) unless the release can be written where the spec says.

    The folder must be, or be made, a writable folder (tried by creating and removing a hidden probe
    file: permission bits alone say nothing for root or read-only mounts), with ``ROOM_FACTOR`` times
    the expected output free, and a file-size limit above the largest expected file. A folder under
    the release's final name is refused as ``AlreadyPublished``. Returns the folder, absolute.
    """
    folder = Path(output_dir).absolute()
    existing = _nearest_existing(folder)
    if existing != folder and not existing.is_dir():
        raise SpecError("output_dir", f"{str(folder)!r} cannot be made: {str(existing)!r} is a file, not a folder")
    if existing == folder and not folder.is_dir():
        raise SpecError("output_dir", f"{str(folder)!r} is a file, not a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        descriptor, probe = tempfile.mkstemp(prefix=".kepsilon-probe-", dir=folder)
        os.close(descriptor)
        os.unlink(probe)
    except OSError as error:
        raise SpecError("output_dir", f"{str(folder)!r} is not writable ({error.strerror or type(error).__name__})") from None
    refuse_existing(release_directory(folder, release_id))
    largest, total = expected_output_bytes(source_bytes)
    free = shutil.disk_usage(folder).free
    if free < ROOM_FACTOR * total:
        raise SpecError(
            "output_dir",
            f"{str(folder)!r} has {free:,} bytes free; this release needs {ROOM_FACTOR * total:,} "
            f"({ROOM_FACTOR} × its expected output of {total:,} bytes, estimated from the source's size)",
        )
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if limit != resource.RLIM_INFINITY and limit < largest:
        raise SpecError(
            "output_dir",
            f"this process may write files of at most {limit:,} bytes (ulimit -f); the release's data file is "
            f"expected to reach {largest:,} bytes",
        )
    return folder


@task(name="check-output", cache_policy=NO_CACHE, persist_result=False)
def check_output(output_dir: str, release_id: str, source_bytes: int) -> str:
    """Prefect task: ``check_output_dir``; returns the absolute output folder."""
    return str(check_output_dir(output_dir, release_id, source_bytes))


def published_record(store: str, release_id: str, key: str) -> ReleaseRecord | None:
    """The private record of this logical release if it is already published, else None.

    Refuses with ``AlreadyPublished`` when the release id was published by *another* logical release
    (another idempotency key): published releases are immutable, and this is known before any ε.
    """
    db = open_store(store)
    try:
        found = db.execute(
            "SELECT idempotency_key, manifest FROM releases WHERE release_id = ? AND outcome = 'published' ORDER BY id",
            (release_id,),
        ).fetchall()
    except sqlite3.Error as error:
        raise unavailable(store, error, "read") from None
    finally:
        db.close()
    if not found:
        return None
    for stored_key, manifest in reversed(found):
        if stored_key == key:
            return json.loads(manifest)
    raise AlreadyPublished(
        f"release {release_id!r} is already published with other parameters or data; "
        "published releases are immutable, so give this one a new release_id"
    )


def complete_publication(record: ReleaseRecord) -> tuple[Path, bool]:
    """Finish a published release whose staging folder was not yet renamed (a crash after its record).

    Returns (final folder, whether it is there now). The staging folder is renamed only if its files
    are the ones the record lists; nothing is rewritten and nothing is recorded.
    """
    final = Path(record.get("output_dir") or record.get("directory") or "")
    if not final.name:
        return final, False
    staging = staging_directory(final.parent, final.name)
    if not final.exists() and staging.is_dir() and staged_outputs(staging) == record.get("outputs"):
        put_in_place(staging, final)
    return final, final.is_dir()


def unchanged_release(store: str, spec, content: str) -> ReleaseRecord | None:
    """The population's last published release if it was published from the same source with the same spec
    (the same ``content_key``; ``flows/manifest.content_key``), else None; always None with
    ``rerelease_unchanged``. A scheduled run over an unchanged source then publishes nothing new and spends
    nothing: fresh noise over the same records would only let them be averaged across releases."""
    if getattr(spec, "rerelease_unchanged", False):
        return None
    db = open_store(store)
    try:
        found = db.execute(
            "SELECT manifest FROM releases WHERE population_id = ? AND outcome = 'published' ORDER BY id DESC LIMIT 1",
            (spec.population_id,),
        ).fetchone()
    except sqlite3.Error as error:
        raise unavailable(store, error, "read") from None
    finally:
        db.close()
    if found is None:
        return None
    record = json.loads(found[0])
    return record if record.get("content_key") == content else None


@task(name="already-published", cache_policy=NO_CACHE, persist_result=False)
def find_published(store: str, release_id: str, key: str) -> ReleaseRecord | None:
    """Prefect task: this logical release's record if it is published (its folder completed if needed)."""
    record = published_record(store, release_id, key)
    if record is None:
        return None
    final, present = complete_publication(record)
    return {**record, "already_published": True, "published_at": str(final), "folder_present": present}


# --------------------------------------------------------------------------- the pre-ε sequence
#
# One sequence of checks that need no noise, shared by the release (both engines), which stops at the first
# refusal, and by ``kepsilon check``, which collects every verdict. The figures are computed from private
# values: they go to the private record and the steward's terminal, never to the public manifest.

from dataclasses import asdict, dataclass  # noqa: E402

from kepsilon.engine.errors import KepsilonError  # noqa: E402

WARN_RELATIVE_ERROR = 0.5  # a predicted error above 50 % earns a warning line even with no limit set


@dataclass
class Verdict:
    """One check's outcome before ε. ``gates``: False where the check is reported only (bounds mode: a
    figure that reads the true ε-quasi values must not decide whether anything is published)."""

    name: str
    success: bool
    figure: float | None = None
    limit: float | None = None
    gates: bool = True
    parameter: str | None = None
    detail: str = ""

    @property
    def refuses(self) -> bool:
        return self.gates and not self.success

    def summary(self) -> str:
        """``<check> <figure> (limit <limit>)``, or ``<check>: <detail>`` for a check without a figure."""
        if self.figure is None:
            return f"{self.name}: {self.detail}" if self.detail else self.name
        text = f"{self.name} {_number(self.figure)}"
        return text + (f" (limit {_number(self.limit)})" if self.limit is not None else "")

    def to_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None and v != ""}


def _number(value: float) -> str:
    value = float(value)
    return f"{100 * value:.2f} %" if 0 < abs(value) < 10 and value != int(value) else f"{value:g}"


class Verdicts:
    """The verdicts of one run of the sequence. A release (``collect=False``) stops at the first refusal
    with a ``SpecError`` naming the parameter and the figure; ``kepsilon check`` collects them all."""

    def __init__(self, collect: bool = False):
        self.collect = collect
        self.items: list[Verdict] = []

    def add(self, verdict: Verdict) -> Verdict:
        self.items.append(verdict)
        if verdict.refuses and not self.collect:
            raise SpecError(
                verdict.parameter or verdict.name,
                f"{verdict.summary()}, predicted before any ε; nothing reserved or spent "
                "(`kepsilon check SPEC` suggests a change)",
            )
        return verdict

    def attempt(self, name: str, check, *args):
        """Run a check that raises a ``KepsilonError`` when it fails: (passed, its result)."""
        try:
            result = check(*args)
        except KepsilonError as failure:
            if not self.collect:
                raise
            self.items.append(Verdict(name, False, parameter=getattr(failure, "parameter", None), detail=str(failure)))
            return False, None
        self.items.append(Verdict(name, True))
        return True, result

    @property
    def refusals(self) -> list[Verdict]:
        return [v for v in self.items if v.refuses]

    def report(self) -> list[dict]:
        return [v.to_dict() for v in self.items]


def pre_epsilon_checks(
    verdicts: Verdicts, spec, *, store: str, key: str, rows_in: int, rows_kept: int, certain_share: float, predict
) -> dict:
    """The checks before ε that the release (either engine) and ``kepsilon check`` share, in order:
    the noise grid at the spec's ε, the seed key, a release with records, the certain linking share, the
    predicted relative error of each ε-quasi, the predicted linking risk, the records confidence
    suppression would leave and the suppression budget (the anonymiser's suppression plus the predicted
    confidence suppression; diversity suppression, which needs the published labels, is left to the gate). ``predict``: a function that returns the
    :class:`kepsilon.engine.predict.Prediction` of the kept records, called once the noise grid has passed
    (it draws throw-away noise on that grid). In bounds mode the figures that read the true ε-quasi values
    are reported, not gated.

    Returns the private summary of the predictions (for the record) and the warning lines.
    """
    from kepsilon.engine.perturb import check_noise_grid

    from .record import check_seed_key

    grid_ok, _ = verdicts.attempt("noise grid", check_noise_grid, spec.roles.e_quasi, spec.epsilon_split())
    verdicts.attempt("seed key", check_seed_key, store, key)
    verdicts.add(Verdict(
        "records kept", rows_kept > 0, figure=rows_kept, limit=1, parameter="k",
        detail="the anonymiser would keep no record: an empty release says nothing",
    ))
    gates = spec.scale_basis == "diameter"  # bounds mode: reported only (they read the true ε-quasi values)
    verdicts.add(Verdict(
        "certain linking risk", certain_share <= spec.max_linking_risk, figure=certain_share,
        limit=spec.max_linking_risk, gates=gates, parameter="max_linking_risk",
        detail="records in zero-diameter classes get no noise and link to themselves",
    ))
    if not grid_ok:  # only in a check: no noise can be drawn at this ε, so nothing is predicted
        return {"predicted": False, "warnings": []}
    prediction = predict()
    errors = prediction.relative_errors()
    warnings = []
    for quasi in spec.roles.e_quasi:
        figure = errors.get(quasi.column, 0.0)
        limit = getattr(quasi, "max_relative_error", None)
        verdicts.add(Verdict(
            f"relative error of {quasi.column}", limit is None or figure <= limit, figure=figure, limit=limit,
            gates=gates, parameter=f"roles.e_quasi.{quasi.column}.max_relative_error",
        ))
        if figure > WARN_RELATIVE_ERROR:
            warnings.append(
                f"warning: predicted relative error of {quasi.column} is {_number(figure)} (over "
                f"{_number(WARN_RELATIVE_ERROR)}); a larger ε or smaller k lowers it (`kepsilon advise`)"
            )
    risk = prediction.linking_risk()
    verdicts.add(Verdict(
        "linking risk", risk <= spec.max_linking_risk, figure=risk, limit=spec.max_linking_risk, gates=gates,
        parameter="max_linking_risk",
    ))
    published = prediction.published_records()
    verdicts.add(Verdict(
        "records published", published > 0, figure=published, limit=1, gates=gates, parameter="confidence",
        detail="confidence suppression would remove every record: an empty release says nothing",
    ))
    suppressed = (rows_in - published) / rows_in if rows_in else 0.0
    verdicts.add(Verdict(
        "suppression", suppressed <= spec.suppression_budget, figure=suppressed, limit=spec.suppression_budget,
        gates=gates or suppressed == (rows_in - rows_kept) / max(rows_in, 1), parameter="suppression_budget",
    ))
    return {
        "predicted_relative_error": errors,
        "predicted_linking_risk": risk,
        "predicted_records_published": published,
        "predicted_suppression": suppressed,
        "draws": prediction.draws,
        "class_share": prediction.share,
        "gated": gates,
        "warnings": warnings,
    }


def fresh_generator():
    """A throw-away noise generator from a fresh ``secrets`` seed (never stored or shown)."""
    import secrets

    import numpy as np

    return np.random.default_rng(secrets.randbits(256))
