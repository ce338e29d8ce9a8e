"""The release report: a summary of the private record for people — a Prefect artifact and the CLI's table.

Built only from the release's private record (``kepsilon.record.ReleaseRecord``, or one read back from the
audit store), which holds parameters, counts and fingerprints, never data values.
"""

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from prefect.artifacts import create_markdown_artifact, create_table_artifact

from kepsilon.guarantee import Guarantee
from kepsilon.tasks.figures import Figure, markdown_image


def summary_rows(record: Mapping[str, Any]) -> list[dict]:
    """The figures a steward or officer looks at first, as (measure, value) rows."""
    if record.get("privacy_model") == "dp":
        return _dp_summary_rows(record)
    loss = record.get("information_loss", {})
    rows = [
        ("release", record["release_id"]),
        ("population", record["population_id"]),
        ("algorithm", record["algorithm"]),
        ("k", record["k"]),
        ("ε", record["epsilon"]),
        ("noise scale basis", record["scale_basis"]),
        ("confidence c", record["confidence"]),
        ("records in", record["rows_in"]),
    ]
    rows += [(f"removed: {stage}", count) for stage, count in record.get("rows_removed", {}).items()]
    rows += [
        ("records published", record.get("rows_published")),
        ("published groups", record.get("groups", {}).get("published")),
        ("smallest group", record.get("groups", {}).get("smallest")),
        ("relative error, measured", _percent(loss.get("measured"))),
        ("relative error, predicted", _percent(loss.get("predicted"))),
        ("linking risk", _percent(record.get("linking_risk"))),
        ("homogeneous groups", record.get("disclosure", {}).get("homogeneous_groups")),
        ("checks passed", f"{sum(c['success'] for c in record.get('checks', []))}/{len(record.get('checks', []))}"),
        ("output", _shown_path(record.get("directory"))),
    ]
    return [{"measure": name, "value": "" if value is None else str(value)} for name, value in rows]


def _dp_summary_rows(record: Mapping[str, Any]) -> list[dict]:
    """The DP mode's summary: its (ε, δ) and parameters, then the private counts (steward only)."""
    dp = record["dp"]
    anonymised = record.get("anonymiser", {})
    node = dp.get("node") or {}
    rows = [
        ("release", record["release_id"]),
        ("population", record["population_id"]),
        ("privacy model", "(ε, δ)-DP: sampling + safe k-anonymisation"),
        ("k", record["k"]),
        ("ε (search + anonymisation)", f"{record['epsilon']} ({dp['epsilon_search']:g} + {dp['epsilon_anonymisation']:g})"),
        ("δ", f"{dp['delta']:.3g} (max {dp['max_delta']:g})"),
        ("sampling β", f"{dp['beta']:.4g}"),
        ("node", ", ".join(f"{column} {level}" for column, level in node.items())),
        ("node chosen by", dp["node_chosen_by"]),
        ("records in", record["rows_in"]),
        ("records sampled", anonymised.get("rows_sampled")),
        ("records suppressed (groups below k)", anonymised.get("rows_suppressed")),
        ("records published", record.get("rows_published")),
        ("published groups", record.get("groups", {}).get("published")),
        ("smallest group", record.get("groups", {}).get("smallest")),
        ("precision loss of the node", _percent(anonymised.get("precision_loss"))),
        ("checks passed", f"{sum(c['success'] for c in record.get('checks', []))}/{len(record.get('checks', []))}"),
        ("output", _shown_path(record.get("directory"))),
    ]
    return [{"measure": name, "value": "" if value is None else str(value)} for name, value in rows]


def _shown_path(directory: str | None) -> str | None:
    """The output folder as the operator would type it: relative to the working directory when inside it.

    A spec file's relative ``output_dir`` is resolved against the spec file, so the record holds an
    absolute path; ``out/…`` reads better at the terminal than the full path.
    """
    if directory is None:
        return None
    path = Path(directory)
    try:
        return str(path.relative_to(Path.cwd())) if path.is_absolute() else directory
    except ValueError:
        return directory


def _percent(value) -> str | None:
    return None if value is None else f"{100 * value:.2f}%"


def markdown_report(record: Mapping[str, Any]) -> str:
    """A markdown page: the summary table, the checks, and the method's honest limits."""
    lines = [f"# Release `{record['release_id']}`", "", "| measure | value |", "|---|---|"]
    lines += [f"| {row['measure']} | {row['value']} |" for row in summary_rows(record)]
    lines += ["", "## Checks", ""]
    lines += [f"- {'✅' if c['success'] else '❌'} `{c['name']}`" for c in record.get("checks", [])]
    lines += ["", "## Guarantee", "", Guarantee.from_record(record).statement()]
    return "\n".join(lines)


def publish_report_artifacts(record: Mapping[str, Any]) -> None:
    """Attach the markdown report and the summary table to the flow run in the Prefect UI."""
    key = "release-" + "".join(ch if ch.isalnum() else "-" for ch in record["release_id"].lower())
    create_markdown_artifact(key=key, markdown=markdown_report(record), description="(k,ε) release report")
    create_table_artifact(key=key + "-summary", table=summary_rows(record), description="release figures")


def artifact_key(name: str) -> str:
    """A Prefect artifact key from any id: lowercase letters, digits and dashes only."""
    return "".join(ch if ch.isalnum() else "-" for ch in name.lower())


PRIVATE_FIGURE_NOTE = "Private: for the steward only, computed from the private data."


def publish_figure_artifact(name: str, figures: dict[str, Figure], captions: dict[str, str], description: str) -> None:
    """Attach each figure to the flow run as a markdown artifact of its own,
    so that the plots show on the run's own page, not only one click away.

    The run's Artifacts tab in the Prefect UI (both its UIs, 3.8) shows one card per artifact with the artifact's
    description rendered as markdown, the first line only in the V1 UI: so the description starts with the
    figure's card-size PNG. The artifact's page (a click on the card) shows the page-size PNG with its caption.
    Embedded as ``data:`` URIs: the browser showing the UI cannot read the worker's report folder. The figures
    are private (computed from private values): they go to the run, never to a release.
    """
    for figure_name, figure in figures.items():
        caption = captions.get(figure_name, figure_name)
        create_markdown_artifact(
            key=f"{artifact_key(name)}-{artifact_key(figure_name)}",
            markdown=f"# {caption}\n\n{PRIVATE_FIGURE_NOTE} One of the {description}.\n\n{markdown_image(figure_name, figure.png)}\n",
            description=f"{markdown_image(caption, figure.card)}\n\nPrivate, for the steward only: {caption}.",
        )
