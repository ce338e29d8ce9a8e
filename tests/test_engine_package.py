"""kepsilon.engine is a plain library: it imports no orchestrator, validator or store, and has no import cycle."""

import ast
import subprocess
import sys
from pathlib import Path

import kepsilon.engine

ENGINE = Path(kepsilon.engine.__file__).parent
FORBIDDEN = ("prefect", "great_expectations", "kepsilon.audit", "kepsilon.tasks", "kepsilon.flows", "sqlite_utils", "dask")


def engine_modules() -> list[str]:
    return sorted(path.stem for path in ENGINE.glob("*.py") if path.stem != "__init__")


def test_importing_every_engine_module_loads_no_orchestrator_validator_or_store():
    modules = ", ".join(f"kepsilon.engine.{name}" for name in engine_modules())
    check = (
        f"import sys, {modules}\n"
        f"loaded = sorted(m for m in sys.modules if m.startswith({FORBIDDEN!r}))\n"
        "print(','.join(loaded))\n"
    )
    result = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == ""


def internal_imports(name: str) -> set[str]:
    """The engine modules ``name`` imports at module level or inside functions."""
    tree = ast.parse((ENGINE / f"{name}.py").read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1 and node.module:
                found.add(node.module.split(".")[0])
            elif node.module and node.module.startswith("kepsilon.engine."):
                found.add(node.module.split(".")[2])
        elif isinstance(node, ast.Import):
            found.update(alias.name.split(".")[2] for alias in node.names if alias.name.startswith("kepsilon.engine."))
    return found & set(engine_modules())


def test_the_engine_has_no_import_cycle():
    graph = {name: internal_imports(name) for name in engine_modules()}
    visiting, done = set(), set()

    def visit(name, path):
        assert name not in visiting, "import cycle: " + " -> ".join(path + [name])
        if name in done:
            return
        visiting.add(name)
        for dependency in graph[name]:
            visit(dependency, path + [name])
        visiting.discard(name)
        done.add(name)

    for name in graph:
        visit(name, [])
    assert graph["mondrian"] and graph["ola"]  # the check sees the real imports


def test_the_import_check_sees_a_forbidden_import(tmp_path):
    """The first test could pass vacuously if the subprocess imported nothing; it does not."""
    check = "import sys, kepsilon.tasks.k_anonymise\nprint(sorted(m for m in sys.modules if m.startswith('prefect'))[:1])"
    result = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, check=True)
    assert "prefect" in result.stdout


def test_a_release_loads_its_heavy_libraries_only_where_it_uses_them():
    """`kepsilon release` imports its flow before its first refusal can answer: Great Expectations (the checks,
    loaded before ε), SciPy (the certificate's estimators and distances) and matplotlib (the figures) are loaded
    by the steps that use them, about 3 s of CPU a refused release does not pay. The Dask engine's flow loads
    Great Expectations and matplotlib in a thread while its workers run, off its critical path."""
    check = (
        "import sys, kepsilon.cli, kepsilon.flows.release, kepsilon.flows.check, kepsilon.flows.release_dask\n"
        "print(','.join(sorted({m.split('.')[0] for m in sys.modules} & {'great_expectations', 'scipy', 'matplotlib'})))\n"
    )
    result = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == ""
