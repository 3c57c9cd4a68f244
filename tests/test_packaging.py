"""What a plain ``pip install large-queue`` brings is enough to import and use the library."""

from __future__ import annotations

import ast
import re
import sys
from importlib import metadata
from pathlib import Path

import large_queue

PACKAGE = Path(large_queue.__file__).parent
# import name -> distribution name, where they differ
DISTRIBUTIONS = {"aerospike_helpers": "aerospike", "yaml": "pyyaml"}


def _third_party_imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return {n for n in names if n not in sys.stdlib_module_names and n not in ("large_queue", "__future__")}


def test_the_core_imports_only_what_a_plain_install_brings() -> None:
    required = {
        re.split(r"[<>=!~ ;\[]", requirement)[0].lower()
        for requirement in metadata.requires("large-queue") or []
        if "extra ==" not in requirement
    }
    # the modules of the spark, metrics and bench extras (the bench imports its one only when installed)
    extras = ("spark", "metrics.py", "_bench_persist.py")
    core = [p for p in PACKAGE.rglob("*.py") if not set(extras) & set(p.relative_to(PACKAGE).parts)]
    missing = {
        f"{path.relative_to(PACKAGE)}: {name}"
        for path in core
        for name in _third_party_imports(path)
        if DISTRIBUTIONS.get(name, name).lower() not in required
    }
    assert not missing, f"imported outside the Spark extra but not installed by default: {sorted(missing)}"
