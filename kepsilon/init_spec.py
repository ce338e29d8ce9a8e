"""``kepsilon init DATA.csv``: a starter release spec for a steward's own table.

It reads the table the way a release does (``tasks/ingest.py``: a CSV as text, Parquet with its
types), looks at each column and writes a spec in which every column has a suggested role, every
k-quasi a hierarchy *builder* (no file to write), every ε-quasi bounds, and the next steps as
comments. The spec it writes loads as it is; the steward's one necessary edit is the bounds, which
are read from the data and therefore private until replaced by public ones.

How a column's role is suggested (first rule that applies):

1. it looks like a direct identifier to the release's own detector (``tasks/classify.py``: e-mail,
   URL, IP address, phone, national id, nearly unique text or identification-like numbers), or its name
   says so (``id``, ``name``, ``email``, ``phone``…), or it holds consecutive whole numbers, one per
   record → ``explicit``;
2. dates in one format → ``k_quasi`` with the ``dates`` builder;
3. fixed-length digit codes named like a postal code, or with leading zeros → ``k_quasi``, ``masking``;
4. numbers: with at most 12 distinct values → ``k_quasi``, ``categories``; whole numbers with at most
   120 distinct values (an age, a count) → ``k_quasi``, ``intervals``; any other number → ``e_quasi``
   (kept, with noise), the method's ε-quasi;
5. text: free text or too many categories → ``explicit`` (removed; a steward may move it after reading
   it); a name that says diagnosis, disease, treatment… → ``sensitive``; other categories →
   ``k_quasi``, ``categories``;
6. a column with missing cells cannot be a k- or ε-quasi (they must be complete) → ``sensitive``.

k: 20 when there is an ε-quasi, else 10 (and at most a twentieth of the records). With Mondrian, a
published group holds k to 2k−1 records, and about two of them — the group's smallest and largest
value — link back to themselves through the noise (the method's linking risk): 2/(1.5 k) ≈ 13 % at
k = 10, above the 10 % gate, and about 7 % at k = 20 (``kepsilon advise`` measured 11.1 % and 6.5 % on the
4,000 generated patients of ``tests/patients.py``).

Nothing is recorded in the audit store and no ε is spent: ``init`` only reads the file, as opening it
in a spreadsheet would. The spec is written under a temporary name, checked with the spec loader,
then linked into place, so an existing file is never overwritten and no half-written spec is left.
"""

import math
import os
import re
from dataclasses import dataclass, field
from datetime import date, datetime
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal
from pathlib import Path

import pandas as pd

from kepsilon.engine.errors import KepsilonError

DEFAULT_EPSILON = 1.0
DEFAULT_CAP = 5
CATEGORY_LIMIT = 12  # numbers with at most this many distinct values are categories
INTERVAL_LIMIT = 120  # whole numbers with at most this many distinct values are binned (age, counts)
TEXT_CATEGORY_LIMIT = 1000  # text with more distinct values is not offered as a k-quasi
HEAVY_TAIL = 10  # an ε-quasi whose largest value is this many times its median gets a warning

_IDENTIFIER_WORDS = {
    "id", "uuid", "guid", "name", "names", "surname", "forename", "firstname", "lastname", "fullname",
    "email", "mail", "phone", "telephone", "tel", "mobile", "fax", "ssn", "nhs", "ppsn", "nino", "passport",
    "address", "street", "ip", "url", "mrn", "username", "login", "iban",
}
_POSTCODE_WORDS = {"zip", "zipcode", "postcode", "postal", "plz", "cp", "cep", "pin", "eircode"}
_SENSITIVE_WORDS = {
    "diagnosis", "diagnoses", "diag", "icd", "disease", "illness", "condition", "treatment", "medication",
    "drug", "drugs", "prescription", "religion", "hiv", "procedure", "symptom", "symptoms",
}
_DATE_FORMATS = ("%Y-%m-%d", "%d/%m/%Y", "%m/%d/%Y", "%Y/%m/%d", "%d.%m.%Y", "%Y-%m-%d %H:%M:%S", "%Y-%m-%dT%H:%M:%S")
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
_WHOLE = re.compile(r"[+-]?\d+")
_FROM_DATA = "replace with public bounds: read from your data (private)"


class InitRefused(KepsilonError):
    """``kepsilon init`` cannot write the spec; the message says why in one line."""


@dataclass
class Suggestion:
    """One column's suggested role, the reason (no data value), and what its role needs."""

    column: str
    role: str  # explicit | k_quasi | e_quasi | sensitive
    why: str
    hierarchy: dict | None = None
    bounds: tuple[Decimal, Decimal] | None = None  # e_quasi, read from the data (private)
    acknowledge: list[str] = field(default_factory=list)

    @property
    def bounds_from_data(self) -> bool:
        """Whether the entry holds numbers read from the data (bounds of an ε-quasi or of intervals)."""
        return self.bounds is not None or (self.hierarchy or {}).get("kind") == "intervals"


@dataclass
class StarterSpec:
    """Everything the written spec says, and the text written."""

    data_path: Path
    spec_path: Path
    rows: int
    suggestions: list[Suggestion]
    k: int
    release_id: str
    population_id: str
    delimiter: str
    text: str = ""

    def by_role(self, role: str) -> list[Suggestion]:
        return [s for s in self.suggestions if s.role == role]


# ---------------------------------------------------------------------------------------------- reading


def read_table(data_path: Path) -> tuple[pd.DataFrame, str]:
    """The table as a release reads it (its ingest), and the CSV delimiter found (``,`` for Parquet)."""
    from kepsilon.flows.spec import SourceSpec
    from kepsilon.tasks.ingest import read_source

    delimiter = _delimiter(data_path)
    source = SourceSpec(path=str(data_path), delimiter=delimiter)
    source.resolved_format()  # a suffix that is neither CSV nor Parquet is refused by name
    return read_source(source).frame, delimiter


def _delimiter(data_path: Path) -> str:
    """The CSV's field separator: the one of , ; tab | that the header line holds most of."""
    if data_path.is_dir() or data_path.suffix.lower() == ".parquet":
        return ","
    try:
        with open(data_path, encoding="utf-8", errors="replace", newline="") as file:
            header = file.readline()
    except OSError:
        return ","  # the ingest refuses the file with the system's reason
    counts = {candidate: header.count(candidate) for candidate in (",", ";", "\t", "|")}
    best = max(counts, key=lambda candidate: counts[candidate])
    return best if counts[best] else ","


# ---------------------------------------------------------------------------------------------- columns


def _words(column: str) -> set[str]:
    """The words of a column name: ``PatientID`` and ``patient_id`` both give {patient, id}."""
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", column)
    words = {word for word in re.split(r"[^a-z0-9]+", spaced.lower()) if word}
    return words | {re.sub(r"[^a-z0-9]", "", column.lower())}


def _texts(values: pd.Series) -> pd.Series:
    """The column as the text data.csv holds (typed Parquet values too); missing cells dropped."""
    from kepsilon.tasks.values import cell_texts

    if isinstance(values.dtype, pd.StringDtype) and not hasattr(values.dtype, "pyarrow_dtype"):
        texts = values
    else:
        texts = pd.Series(cell_texts(values), index=values.index, dtype=object)
    texts = texts[texts.notna()].astype(str)
    return texts[texts != ""]  # the default `source.missing`: the empty cell


def suggest(column: str, values: pd.Series) -> Suggestion:
    """The suggested role of one column (module docstring); reasons never quote a value."""
    from kepsilon.tasks.classify import identifier_reasons

    texts = _texts(values)
    words = _words(column)
    if texts.empty:
        return Suggestion(column, "explicit", "every cell is empty: removed")
    distinct = texts.unique()
    numeric = bool(texts.str.fullmatch(_NUMBER.pattern).all())
    reasons = identifier_reasons(values[values.notna() & (values.astype(str) != "")])
    patterns = [reason for reason in reasons if reason != "near_unique"]

    if patterns and not numeric:
        return Suggestion(column, "explicit", f"its values look like {_PATTERN_TEXT[patterns[0]]}: removed")
    if words & _IDENTIFIER_WORDS:
        return Suggestion(column, "explicit", "its name says it identifies people: removed")
    if numeric and "national_id" in patterns and "near_unique" in reasons:
        return Suggestion(column, "explicit", "nearly unique numbers that look like identification numbers: removed")
    if numeric and _consecutive_record_numbers(texts):
        return Suggestion(column, "explicit", "one consecutive whole number per record (a record number): removed")

    missing = len(texts) < len(values)
    if missing:
        if not numeric and "near_unique" in reasons:
            return Suggestion(column, "explicit", "nearly unique text: removed")
        return Suggestion(
            column, "sensitive",
            "has missing cells, so it cannot be a k-quasi or ε-quasi (they must be complete): released as read",
        )
    date_format = _date_format(distinct)
    if date_format:
        return Suggestion(
            column, "k_quasi", "dates: generalised to month, year, decade",
            hierarchy={"kind": "dates", "format": date_format, "levels": ["month", "year", "decade"]},
            acknowledge=["near_unique"] if "near_unique" in reasons else [],
        )
    if _is_code(distinct, words):
        length = len(distinct[0])
        return Suggestion(
            column, "k_quasi", f"codes of {length} characters: masked from the right",
            hierarchy={"kind": "masking", "length": length},
            acknowledge=["near_unique"] if "near_unique" in reasons else [],
        )
    if numeric:
        return _numeric(column, texts, distinct, patterns)
    if "near_unique" in reasons:
        return Suggestion(column, "explicit", "nearly unique text (an identifier or free text): removed")
    if _free_text(distinct):
        return Suggestion(column, "explicit", "free text (it may name people): removed; read it before releasing it")
    if words & _SENSITIVE_WORDS:
        return Suggestion(column, "sensitive", "its name says it is what the release protects: released as read")
    if len(distinct) > TEXT_CATEGORY_LIMIT:
        return Suggestion(column, "explicit", "too many categories to generalise without groups: removed")
    return Suggestion(
        column, "k_quasi", "categories: each value, or * (declare groups for a level between)",
        hierarchy={"kind": "categories"},
    )


_PATTERN_TEXT = {
    "email": "e-mail addresses", "url": "URLs", "ip_address": "IP addresses", "phone": "phone numbers",
    "national_id": "identification numbers",
}


def _numeric(column: str, texts: pd.Series, distinct, patterns: list[str]) -> Suggestion:
    """A column of numbers: categories, intervals (whole numbers, few values) or an ε-quasi."""
    acknowledge = [reason for reason in patterns if reason == "national_id"]
    if len(distinct) <= CATEGORY_LIMIT:
        return Suggestion(
            column, "k_quasi", "a number with few values: categories", hierarchy={"kind": "categories"},
            acknowledge=acknowledge,
        )
    numbers = pd.to_numeric(texts)
    low, high = Decimal(repr(float(numbers.min()))), Decimal(repr(float(numbers.max())))
    if texts.str.fullmatch(_WHOLE.pattern).all() and len(distinct) <= INTERVAL_LIMIT:
        return Suggestion(
            column, "k_quasi", "whole numbers with few values (an age, a count): intervals",
            hierarchy=_intervals(low, high), acknowledge=acknowledge,
        )
    why = "numbers: kept, with noise per group"
    median = float(numbers.abs().median())
    if median > 0 and float(numbers.abs().max()) > HEAVY_TAIL * median:
        # The noise follows each group's range, which one very large value stretches for its whole group.
        why += (
            "; a long tail of large values: expect a large error (kepsilon advise predicts it), or generalise it "
            "instead (k_quasi with an intervals hierarchy)"
        )
    return Suggestion(column, "e_quasi", why, bounds=_outward(low, high), acknowledge=acknowledge)


def _consecutive_record_numbers(texts: pd.Series) -> bool:
    if len(texts) < 100 or not texts.str.fullmatch(_WHOLE.pattern).all():
        return False
    numbers = pd.to_numeric(texts)
    return numbers.nunique() == len(numbers) and int(numbers.max()) - int(numbers.min()) + 1 == len(numbers)


def _date_format(distinct) -> str | None:
    """The one format every distinct value parses in, if any (dates are not numbers: 20200101 is one)."""
    sample = [str(value) for value in distinct]
    if not sample or all(_NUMBER.fullmatch(value) for value in sample):
        return None
    for candidate in _DATE_FORMATS:
        try:
            for value in sample:
                datetime.strptime(value, candidate)
        except ValueError:
            continue
        return candidate
    return None


def _is_code(distinct, words: set[str]) -> bool:
    """Fixed-length digit codes that are not quantities: a postal-code name, or leading zeros kept."""
    values = [str(value) for value in distinct]
    lengths = {len(value) for value in values}
    if len(lengths) != 1 or lengths.pop() < 3 or not all(value.isdigit() for value in values):
        return False
    return bool(words & _POSTCODE_WORDS) or any(value.startswith("0") for value in values)


def _free_text(distinct) -> bool:
    values = [str(value) for value in distinct[:2000]]
    return sum(len(value) for value in values) / len(values) > 40 or sum(value.count(" ") >= 3 for value in values) > len(values) / 2


def _outward(low: Decimal, high: Decimal) -> tuple[Decimal, Decimal]:
    """[low, high] widened to multiples of the power of ten of its span (0..1,002,300 → 0..2,000,000):
    coarser than the data's extremes, but still read from the data."""
    span = high - low
    step = Decimal(10) ** (math.floor(math.log10(span)) if span > 0 else 0)
    lower = (low / step).to_integral_value(ROUND_FLOOR) * step
    upper = (high / step).to_integral_value(ROUND_CEILING) * step
    if upper == lower:
        upper += step
    return lower, upper


def _intervals(low: Decimal, high: Decimal) -> dict:
    """Intervals of a nice width w (1, 2, 5 × 10ⁿ; at most 20 bins over the data's span), 2w and 4w,
    anchored at a multiple of 4w so that every level's bins nest."""
    span = max(high - low, Decimal(1))
    width = next(
        Decimal(m) * Decimal(10) ** e for e in range(0, 30) for m in (1, 2, 5) if span / (Decimal(m) * Decimal(10) ** e) <= 20
    )
    top = 4 * width
    lower = (low / top).to_integral_value(ROUND_FLOOR) * top
    upper = max((high / top).to_integral_value(ROUND_CEILING) * top, lower + top)
    return {"kind": "intervals", "lower": lower, "upper": upper, "widths": [width, 2 * width, top]}


# ---------------------------------------------------------------------------------------------- the spec


def suggest_spec(data_path: Path, spec_path: Path) -> StarterSpec:
    """Read the table and suggest a spec for it (nothing written)."""
    frame, delimiter = read_table(data_path)
    suggestions = [suggest(str(column), frame[column]) for column in frame.columns]
    if not any(s.role == "k_quasi" for s in suggestions):
        _promote_a_k_quasi(suggestions, frame)
    rows = len(frame)
    has_noise = any(s.role == "e_quasi" for s in suggestions)
    k = max(2, min(20 if has_noise else 10, rows // 20))
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", data_path.stem).strip("-._")[:100] or "release"
    if not stem[0].isalnum():
        stem = "r" + stem
    return StarterSpec(data_path, spec_path, rows, suggestions, k, f"{stem}-{{date}}", stem, delimiter)


def _promote_a_k_quasi(suggestions: list[Suggestion], frame: pd.DataFrame) -> None:
    """A release needs a k-quasi: the ε-quasi with the fewest distinct values becomes one (intervals)."""
    numbers = [s for s in suggestions if s.role == "e_quasi"]
    if not numbers:
        raise InitRefused(
            "no column can be a k-quasi (categories, codes, dates or numbers, complete); write the spec by hand "
            "(docs/spec.md)"
        )
    chosen = min(numbers, key=lambda s: frame[s.column].nunique())
    if chosen.bounds is None:  # every ε-quasi suggestion carries the bounds read for it
        raise ValueError(f"suggestion for {chosen.column!r} has no bounds")
    chosen.role, chosen.hierarchy = "k_quasi", _intervals(*chosen.bounds)
    chosen.bounds, chosen.why = None, "numbers: intervals (a release needs at least one k-quasi)"


_PLAIN = re.compile(r"[A-Za-z_][A-Za-z0-9_ .-]*[A-Za-z0-9_.]|[A-Za-z_]")
_YAML_WORDS = {"y", "n", "yes", "no", "true", "false", "on", "off", "null", "none", "nan", "inf"}


def _yaml_text(text: str) -> str:
    """A YAML scalar that reads back as exactly ``text`` (quoted unless plainly safe)."""
    if _PLAIN.fullmatch(text) and text.lower() not in _YAML_WORDS and ": " not in text and " #" not in text:
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _number(value: Decimal) -> str:
    return format(value.normalize(), "f")


def _hierarchy_text(definition: dict) -> str:
    if definition["kind"] == "intervals":
        widths = ", ".join(_number(w) for w in definition["widths"])
        return (
            f"{{kind: intervals, lower: {_number(definition['lower'])}, upper: {_number(definition['upper'])}, "
            f"widths: [{widths}]}}"
        )
    if definition["kind"] == "masking":
        return f"{{kind: masking, length: {definition['length']}}}"
    if definition["kind"] == "dates":
        return f"{{kind: dates, format: {_yaml_text(definition['format'])}, levels: [{', '.join(definition['levels'])}]}}"
    return "{kind: categories}"


def render(starter: StarterSpec) -> str:
    """The spec's YAML text, with the steps and the reasons as comments."""
    spec_dir = starter.spec_path.parent.resolve()
    source = os.path.relpath(starter.data_path.resolve(), spec_dir)
    spec_name = starter.spec_path.name
    population = starter.population_id
    lines = [
        f"# Starter release spec for {starter.data_path.name}, written by `kepsilon init` on {date.today().isoformat()}.",
        "# Every column of the file has a suggested role below: check each one, then",
        "#   1. replace every number marked 'replace with public bounds'. It was read from your data (its",
        "#      smallest and largest values, rounded outward), so it is private, and the release publishes",
        "#      it in manifest.json: use limits anyone may know (a codebook, a legal range) that hold every record.",
        "#   2. set the population's lifetime ε cap, once (a release of a population without a cap is refused):",
        f'#        kepsilon audit set-cap {population} {DEFAULT_CAP} --by "YOUR NAME" --reason "WHY"',
        f"#      Every release of these people spends ε from it (this one: epsilon = {DEFAULT_EPSILON:g}); a release",
        f"#      that would pass the cap is refused before any noise. {DEFAULT_CAP} leaves room for this release and",
        "#      a few more; agree the figure with your privacy officer (`kepsilon audit budget` shows what is left).",
        f"#   3. kepsilon check {spec_name}     a dry run: 'would publish', or what to change; spends nothing",
        f"#   4. kepsilon release {spec_name}   publishes into {_output_dir()}/{population}-DATE/ beside this file",
        "# Every field: docs/spec.md. Hierarchies (builders and files): docs/hierarchies.md.",
        f"release_id: {_yaml_text(starter.release_id)}   # {{date}}: the run's day, so each day's run has its own id",
        f"population_id: {_yaml_text(population)}   # the people whose ε budget the release spends",
    ]
    source_line = f"source: {{path: {_yaml_text(source)}"
    if starter.delimiter != ",":
        source_line += f", delimiter: {_yaml_text(starter.delimiter)}"
    lines.append(source_line + "}   # relative to this file; missing: [\"\"] (the empty cell) by default")
    lines.append("roles:")
    lines += _role_lines(starter)
    lines += _parameter_lines(starter)
    return "\n".join(lines) + "\n"


def _output_dir() -> str:
    return "out"


def _role_lines(starter: StarterSpec) -> list[str]:
    heads = {
        "explicit": "removed before anything else (direct identifiers)",
        "k_quasi": "generalised through their hierarchy until every published group has at least k records",
        "e_quasi": "numbers kept, with Laplace noise per group (bounds: the plausible range)",
        "sensitive": "released as read; {column: …, l_diversity: {l: 3}} makes every group hold 3 values",
    }
    lines = []
    for role, head in heads.items():
        entries = starter.by_role(role)
        if not entries:
            lines.append(f"  {role}: []   # {head}")
            continue
        lines.append(f"  {role}:   # {head}")
        for entry in entries:
            lines += _entry_lines(entry)
    return lines


def _entry_lines(entry: Suggestion) -> list[str]:
    name = _yaml_text(entry.column)
    if entry.role in ("explicit", "sensitive"):
        return [f"    - {name}   # {entry.why}"]
    lines = [f"    - column: {name}   # {entry.why}"]
    if entry.acknowledge:
        lines.append(
            f"      acknowledge_identifier: [{', '.join(entry.acknowledge)}]   # the detector's signal, expected for this kind of column"
        )
    if entry.role == "k_quasi":
        if entry.hierarchy is None:  # suggest() gives every k-quasi a hierarchy builder
            raise ValueError(f"k-quasi suggestion for {entry.column!r} has no hierarchy")
        comment = _FROM_DATA if entry.bounds_from_data else _HIERARCHY_NOTE[entry.hierarchy["kind"]]
        lines.append(f"      hierarchy: {_hierarchy_text(entry.hierarchy)}   # {comment}")
    else:
        if entry.bounds is None:  # suggest() gives every ε-quasi the bounds it read
            raise ValueError(f"ε-quasi suggestion for {entry.column!r} has no bounds")
        lower, upper = entry.bounds
        lines.append(f"      lower: {_number(lower)}   # {_FROM_DATA}")
        lines.append(f"      upper: {_number(upper)}   # {_FROM_DATA}")
    return lines


_HIERARCHY_NOTE = {
    "categories": "each value, then *; or groups: {label: [values], …} for value → group → *",
    "masking": "the last characters masked one by one, then *",
    "dates": "the date, its month, year, decade, then *",
}


def _parameter_lines(starter: StarterSpec) -> list[str]:
    if starter.by_role("e_quasi"):
        why_k = (
            "each published group holds k to 2k-1 records; about two of them (its smallest and largest value) "
            "link back through the noise, and the gate allows 10 %: 2/(1.5 k) is about 7 % at k = 20, 13 % at k = 10"
        )
    else:
        why_k = "each published group holds at least k records"
    return [
        f"k: {starter.k}   # {why_k}",
        f"epsilon: {DEFAULT_EPSILON:g}   # ε per record, shared by the ε-quasis; less ε: more noise, less spent from the cap",
        "algorithm: mondrian",
        "max_linking_risk: 0.10   # the gate refuses a release whose noisy values link back to more records than this",
        f"output_dir: {_output_dir()}   # published files go to {_output_dir()}/RELEASE_ID/, relative to this file",
    ]


# ---------------------------------------------------------------------------------------------- writing


def default_spec_path(data_path: Path) -> Path:
    """``patients.csv`` → ``patients.yaml`` in the current folder."""
    return Path.cwd() / f"{data_path.stem}.yaml"


def write_starter_spec(data_path: Path, spec_path: Path | None = None) -> StarterSpec:
    """Suggest a spec for ``data_path`` and write it to ``spec_path``, never over an existing file.

    The text is written under a temporary name (0600: its bounds are private until replaced), loaded
    with the spec loader to prove it is a valid spec, then hard-linked to its name, which fails if the
    name exists; the temporary name is removed whatever happens.
    """
    from kepsilon.flows.spec import load_spec

    spec_path = Path(spec_path) if spec_path is not None else default_spec_path(data_path)
    if spec_path.exists() or spec_path.is_symlink():
        raise InitRefused(f"{spec_path} already exists; init never overwrites a spec (choose another with -o)")
    if not spec_path.parent.is_dir():
        raise InitRefused(f"the folder of {spec_path} does not exist")
    starter = suggest_spec(Path(data_path), spec_path)
    starter.text = render(starter)
    temporary = spec_path.parent / f".{spec_path.name}.{os.getpid()}.init"
    try:
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w", encoding="utf-8") as file:
            file.write(starter.text)
            file.flush()
            os.fsync(file.fileno())
        load_spec(temporary)  # the spec must load as written (a failure here is a bug of init)
        try:
            os.link(temporary, spec_path)
        except FileExistsError:
            raise InitRefused(f"{spec_path} already exists; init never overwrites a spec (choose another with -o)") from None
    except OSError as error:
        raise InitRefused(f"cannot write {spec_path} ({error.strerror})") from None
    finally:
        temporary.unlink(missing_ok=True)
    return starter


def summary_lines(starter: StarterSpec) -> list[str]:
    """What the terminal shows after writing: each column's role and why, then the next steps."""
    width = max(len(s.column) for s in starter.suggestions)
    shown = os.path.relpath(starter.spec_path)
    lines = [f"wrote {shown}: a role for each of the {len(starter.suggestions)} columns of {starter.data_path.name} "
             "(nothing recorded, no ε spent)"]
    lines += [f"  {s.column:<{width}}  {s.role:<9}  {s.why}" for s in starter.suggestions]
    steps = []
    if any(s.bounds_from_data for s in starter.suggestions):
        steps.append(f"replace the numbers marked 'replace with public bounds' in {shown} (read from your data: private)")
    steps += [
        f'kepsilon audit set-cap {starter.population_id} {DEFAULT_CAP} --by "YOUR NAME" --reason "WHY"   (once per population)',
        f"kepsilon check {shown}",
        f"kepsilon release {shown}",
    ]
    lines.append("next:")
    lines += [f"  {number}. {step}" for number, step in enumerate(steps, start=1)]
    return lines
