"""The k-anonymisation stage driven by a release spec: hierarchies loaded or built, then Mondrian or OLA.

This is the glue a notebook and the flow share: the spec says which algorithm, which k-quasis and
hierarchies, which sensitive criteria; the algorithms themselves take plain arguments.
"""

import pandas as pd

from .criteria import build_criteria, load_sensitive_hierarchies
from .hierarchy import Hierarchy, load_hierarchy
from .hierarchy_builders import build_hierarchy
from .mondrian import mondrian
from .ola import ola
from .partition import Partition


def load_hierarchies(spec, frame: pd.DataFrame) -> dict[str, Hierarchy]:
    """The spec's hierarchies by column: a hierarchy file, or one built from a public definition.

    A built hierarchy is materialised over the column's values (``build_hierarchy``), but its labels
    and its SHA-256 come from the definition alone, so they are as public as a file's.
    """
    hierarchies = {}
    for quasi in spec.roles.k_quasi:
        if quasi.hierarchy is None:
            continue
        if isinstance(quasi.hierarchy, str):
            hierarchies[quasi.column] = load_hierarchy(quasi.hierarchy, quasi.column)
        else:
            hierarchies[quasi.column] = build_hierarchy(quasi.hierarchy, frame[quasi.column], quasi.column)
    return hierarchies


def k_anonymise(frame: pd.DataFrame, spec) -> Partition:
    """Partition the records with the spec's algorithm (Mondrian or OLA); hierarchy hashes go in the report."""
    hierarchies = load_hierarchies(spec, frame)
    columns = [q.column for q in spec.roles.k_quasi]
    criteria = build_criteria(spec.roles.sensitive, frame, load_sensitive_hierarchies(spec.roles.sensitive))
    if spec.algorithm == "ola":
        partition = ola(frame, columns, spec.k, hierarchies, spec.suppression_budget, spec.ola_metric, criteria)
        partition.levels = {column: int(level) for column, level in partition.report["node"].items()}
    else:
        partition = mondrian(frame, columns, spec.k, hierarchies, criteria)
    partition.criteria = criteria
    partition.hierarchies = hierarchies
    partition.report["hierarchies"] = {column: h.sha256 for column, h in hierarchies.items()}
    return partition
