"""The release report: a summary of the manifest for people — a Prefect artifact and the CLI's table.

Built only from the manifest, which holds parameters, counts and fingerprints, never data values.
"""

from pathlib import Path

from prefect.artifacts import create_markdown_artifact, create_table_artifact

from kepsilon.tasks.figures import Figure, markdown_image


def summary_rows(manifest: dict) -> list[dict]:
    """The figures a steward or officer looks at first, as (measure, value) rows."""
    if manifest.get("privacy_model") == "dp":
        return _dp_summary_rows(manifest)
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
        ("published groups", manifest.get("groups", {}).get("published")),
        ("smallest group", manifest.get("groups", {}).get("smallest")),
        ("relative error, measured", _percent(loss.get("measured"))),
        ("relative error, predicted", _percent(loss.get("predicted"))),
        ("linking risk", _percent(manifest.get("linking_risk"))),
        ("homogeneous groups", manifest.get("disclosure", {}).get("homogeneous_groups")),
        ("checks passed", f"{sum(c['success'] for c in manifest.get('checks', []))}/{len(manifest.get('checks', []))}"),
        ("output", _shown_path(manifest.get("directory"))),
    ]
    return [{"measure": name, "value": "" if value is None else str(value)} for name, value in rows]


def _dp_summary_rows(manifest: dict) -> list[dict]:
    """The DP mode's summary: its (ε, δ) and parameters, then the private counts (steward only)."""
    dp = manifest["dp"]
    anonymised = manifest.get("anonymiser", {})
    node = dp.get("node") or {}
    rows = [
        ("release", manifest["release_id"]),
        ("population", manifest["population_id"]),
        ("privacy model", "(ε, δ)-DP: sampling + safe k-anonymisation"),
        ("k", manifest["k"]),
        ("ε (search + anonymisation)", f"{manifest['epsilon']} ({dp['epsilon_search']:g} + {dp['epsilon_anonymisation']:g})"),
        ("δ", f"{dp['delta']:.3g} (max {dp['max_delta']:g})"),
        ("sampling β", f"{dp['beta']:.4g}"),
        ("node", ", ".join(f"{column} {level}" for column, level in node.items())),
        ("node chosen by", dp["node_chosen_by"]),
        ("records in", manifest["rows_in"]),
        ("records sampled", anonymised.get("rows_sampled")),
        ("records suppressed (groups below k)", anonymised.get("rows_suppressed")),
        ("records published", manifest.get("rows_published")),
        ("published groups", manifest.get("groups", {}).get("published")),
        ("smallest group", manifest.get("groups", {}).get("smallest")),
        ("precision loss of the node", _percent(anonymised.get("precision_loss"))),
        ("checks passed", f"{sum(c['success'] for c in manifest.get('checks', []))}/{len(manifest.get('checks', []))}"),
        ("output", _shown_path(manifest.get("directory"))),
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


def markdown_report(manifest: dict) -> str:
    """A markdown page: the summary table, the checks, and the method's honest limits."""
    lines = [f"# Release `{manifest['release_id']}`", "", "| measure | value |", "|---|---|"]
    lines += [f"| {row['measure']} | {row['value']} |" for row in summary_rows(manifest)]
    lines += ["", "## Checks", ""]
    lines += [f"- {'✅' if c['success'] else '❌'} `{c['name']}`" for c in manifest.get("checks", [])]
    guarantee = (
        dp_guarantee_statement(manifest["k"], manifest["epsilon"], manifest["dp"])
        if manifest.get("privacy_model") == "dp"
        else guarantee_statement(manifest["scale_basis"])
    )
    lines += ["", "## Guarantee", "", guarantee]
    return "\n".join(lines)


def guarantee_statement(scale_basis: str) -> str:
    """What the release does and does not guarantee (method.md §7), stated for its scale basis.

    The same text goes into the public manifest, the report and the README's guarantees.
    """
    if scale_basis == "bounds":
        noise = (
            "Noise scale from public bounds: given the partition, the ε-quasis are ε-differentially private "
            "(Laplace noise of scale (upper − lower)/ε per record, values clamped to the bounds, outputs rounded "
            "to a public grid; confidence suppression is not applied because it would read the true values). "
            "The partition (Mondrian's cuts or OLA's node) is computed from the private data, so the release "
            "as a whole is not ε-DP."
        )
    else:
        noise = (
            "Noise scale from each class's diameter (the paper's method): records are indistinguishable on their "
            "ε-quasis inside their equivalence class against an adversary who knows the quasi-identifiers. The "
            "scale, the partition and confidence suppression read the private data, so the release is not "
            "ε-differentially private; a class whose members share one value (zero diameter) publishes that "
            "value exactly. The ε summed in the ledger for such releases is bookkeeping, not DP composition: "
            "re-releases with fresh noise can be averaged."
        )
    return (
        f"k-anonymity on the published k-quasi labels, which are nodes of public hierarchies. {noise} "
        "Sensitive attributes are published as they are: a group whose members share one sensitive value "
        "discloses it (homogeneity attack). Re-releasing the same people with a different partition allows "
        "intersection attacks."
    )


def dp_guarantee_statement(k: int, epsilon: float, dp: dict) -> str:
    """What a DP-mode release guarantees, with its numbers, and what it does not cover (docs/dp-mode.md).

    The same text goes into the public manifest and the report.
    """
    search = (
        f"the node was chosen by the exponential mechanism on the full data (ε_search = {dp['epsilon_search']:g}), "
        if dp["epsilon_search"] > 0
        else "the node was fixed in the spec, without looking at the data, "
    )
    return (
        f"({epsilon:g}, {dp['delta']:.3g})-differential privacy for each record, between data sets that differ by one "
        f"record added or removed: {search}every record was sampled with probability β = {dp['beta']:.4g}, and every "
        f"group of sampled records sharing all released labels was suppressed when smaller than k = {k} (Li, Qardaji "
        f"and Su 2012: (ε_anon = {dp['epsilon_anonymisation']:g}, δ)-DP; sequential composition with the search). "
        "Every released column is part of the group key and is published at a level of a public hierarchy, or as "
        "read for a sensitive column at level 0; nothing is noised and no suppression reads a value beyond its "
        "group's size. δ bounds the probability of outputs the ε bound does not hold for. Not covered: the schema "
        "(column names, roles and types), the public hierarchies, and the decision to release at all; releases of "
        "the same people compose: their ε and δ add up (the ledger's DP total)."
    )


def publish_report_artifacts(manifest: dict) -> None:
    """Attach the markdown report and the summary table to the flow run in the Prefect UI."""
    key = "release-" + "".join(ch if ch.isalnum() else "-" for ch in manifest["release_id"].lower())
    create_markdown_artifact(key=key, markdown=markdown_report(manifest), description="(k,ε) release report")
    create_table_artifact(key=key + "-summary", table=summary_rows(manifest), description="release figures")


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
