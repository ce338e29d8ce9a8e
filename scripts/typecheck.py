"""`make test`'s type check: mypy over the files [tool.mypy] names, with the layout the package installs.

flows/, tasks/ and audit/ sit at the top of the repository but install as ``kepsilon.flows``, ``kepsilon.tasks``
and ``kepsilon.audit`` (pyproject's package-dir), and the code imports them by those names. Plain ``mypy`` finds
no module ``kepsilon.flows`` (the editable install maps it with an import hook mypy cannot read), so with
``ignore_missing_imports`` every such import would silently become ``Any`` and the checks across the layers would
check nothing. Here each file under those folders is handed to mypy under its installed name, so the imports
resolve to the real modules and their types. Arguments and options are mypy's (``python scripts/typecheck.py
flows/spec.py``); without files it checks [tool.mypy]'s ``files``. Exit status: mypy's (0 clean, 1 errors).
"""

from __future__ import annotations

import sys
from pathlib import Path

from mypy import build
from mypy.errors import CompileError
from mypy.main import process_options
from mypy.modulefinder import BuildSource, FindModuleCache, ModuleSearchResult

INSTALLED_UNDER_KEPSILON = ("flows", "tasks", "audit")
ROOT = Path(__file__).resolve().parent.parent
_find_module = FindModuleCache.find_module


def _find_installed(self: FindModuleCache, id: str, *, fast_path: bool = False) -> ModuleSearchResult:
    """mypy's module search, which also finds ``kepsilon.flows.x`` at ``flows/x.py`` (as the package installs it):
    ``from kepsilon.audit import queries`` asks the search whether ``kepsilon.audit.queries`` is a module."""
    parts = id.split(".")
    if len(parts) > 1 and parts[0] == "kepsilon" and parts[1] in INSTALLED_UNDER_KEPSILON:
        base = ROOT.joinpath(*parts[1:])
        for candidate in (base / "__init__.py", base.with_suffix(".py")):
            if candidate.is_file():
                return str(candidate)
    return _find_module(self, id, fast_path=fast_path)


def installed_name(module: str) -> str:
    """``flows.release`` → ``kepsilon.flows.release``; other modules keep their names."""
    return f"kepsilon.{module}" if module.split(".")[0] in INSTALLED_UNDER_KEPSILON else module


def main(arguments: list[str]) -> int:
    FindModuleCache.find_module = _find_installed  # type: ignore[method-assign]  # mypy has no hook for a package-dir map
    sources, options = process_options(arguments)
    renamed = [BuildSource(s.path, installed_name(s.module), s.text, s.base_dir) for s in sources]
    try:
        result = build.build(renamed, options, stdout=sys.stdout, stderr=sys.stderr)
    except CompileError as error:
        print("\n".join(error.messages), file=sys.stderr)
        return 2
    for line in result.errors:
        print(line)
    errors = sum(1 for line in result.errors if ": error:" in line)
    if errors:
        print(f"Found {errors} error(s) in {len(renamed)} source files checked")
        return 1
    print(f"Success: no issues found in {len(renamed)} source files")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
