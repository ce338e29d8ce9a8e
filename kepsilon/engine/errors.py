"""Errors the engine raises on bad parameters or unusable input.

Every error names the column or parameter at fault and never quotes a data value: messages reach
logs and the Prefect UI, where raw records must not go.
"""


class KepsilonError(Exception):
    """Base of every error a release reports to its user."""


class SpecError(KepsilonError):
    """The release spec or one of its parameters is invalid."""

    def __init__(self, parameter: str, problem: str):
        self.parameter = parameter
        self.problem = problem
        super().__init__(f"parameter {parameter!r}: {problem}")

    def __reduce__(self):
        # Rebuilt from its two arguments when it crosses processes (a Dask worker's failure).
        return (type(self), (self.parameter, self.problem))


class InputError(KepsilonError):
    """The source data is unusable for the release as specified."""

    def __init__(self, column: str | None, problem: str):
        self.column = column
        self.problem = problem
        where = f"column {column!r}: " if column is not None else "source: "
        super().__init__(where + problem)

    def __reduce__(self):
        # Rebuilt from its two arguments when it crosses processes (a Dask worker's failure).
        return (type(self), (self.column, self.problem))


class HierarchyError(InputError):
    """A generalisation hierarchy is malformed or does not cover the data."""
