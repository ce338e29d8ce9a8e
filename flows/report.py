"""The release report: a summary of the manifest for people — a Prefect artifact and the CLI's table.

Built only from the manifest, which holds parameters, counts and fingerprints, never data values.
"""

from prefect.artifacts import create_markdown_artifact, create_table_artifact


def summary_rows(manifest: dict) -> list[dict]:
    """The figures a steward or officer looks at first, as (measure, value) rows."""
    loss = manifest.get("information_loss", {})
    rows = [
        ("release", manifest["release_id"]),
        ("population", manifest["population_id"]),
        ("algorithm", manifest["algorithm"]),
        ("k", manifest["k"]),
        ("ε", manifest["epsilon"]),
        ("noise scale basis", manifest["scale_basis"]),
        ("confidence c", manifest["confidence"]),
        ("records in", manifest["rows_in"]),
    ]
    rows += [(f"removed: {stage}", count) for stage, count in manifest.get("rows_removed", {}).items()]
    rows += [
        ("records published", manifest.get("rows_published")),
        ("equivalence classes", manifest.get("classes", {}).get("n_classes")),
        ("smallest class", manifest.get("classes", {}).get("smallest_class")),
        ("relative error, measured", _percent(loss.get("measured"))),
        ("relative error, predicted", _percent(loss.get("predicted"))),
        ("linking risk", _percent(manifest.get("linking_risk"))),
        ("checks passed", f"{sum(c['success'] for c in manifest.get('checks', []))}/{len(manifest.get('checks', []))}"),
        ("output", manifest.get("directory")),
    ]
    return [{"measure": name, "value": "" if value is None else str(value)} for name, value in rows]


def _percent(value) -> str | None:
    return None if value is None else f"{100 * value:.2f}%"


def markdown_report(manifest: dict) -> str:
    """A markdown page: the summary table, the checks, and the method's honest limits."""
    lines = [f"# Release `{manifest['release_id']}`", "", "| measure | value |", "|---|---|"]
    lines += [f"| {row['measure']} | {row['value']} |" for row in summary_rows(manifest)]
    lines += ["", "## Checks", ""]
    lines += [f"- {'✅' if c['success'] else '❌'} `{c['name']}`" for c in manifest.get("checks", [])]
    lines += ["", "## Guarantee", "", guarantee_statement(manifest["scale_basis"])]
    return "\n".join(lines)


def guarantee_statement(scale_basis: str) -> str:
    """What the release does and does not guarantee (method.md §7), stated for its scale basis."""
    if scale_basis == "bounds":
        return (
            "Noise scale from public bounds: each ε-quasi is ε-differentially private *given the partition*. "
            "The partition itself (Mondrian's cuts or OLA's node) and confidence suppression are computed from "
            "the private data, so the release as a whole is not ε-DP."
        )
    return (
        "Noise scale from each class's diameter (the paper's method): records are indistinguishable *inside* "
        "their equivalence class against an adversary who knows the quasi-identifiers. The scale is computed "
        "from the private data, so the release is **not** ε-differentially private in the standard sense."
    )


def publish_report_artifacts(manifest: dict) -> None:
    """Attach the markdown report and the summary table to the flow run in the Prefect UI."""
    key = "release-" + "".join(ch if ch.isalnum() else "-" for ch in manifest["release_id"].lower())
    create_markdown_artifact(key=key, markdown=markdown_report(manifest), description="(k,ε) release report")
    create_table_artifact(key=key + "-summary", table=summary_rows(manifest), description="release figures")
