"""No package of execwatch imports another package's private names."""

from __future__ import annotations

import ast
from collections.abc import Collection
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src" / "execwatch"


def package_of(module: str) -> str:
    """execwatch.scan.runner -> scan; execwatch.record -> record (a top-level module)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def module_name(path: Path) -> str:
    rel = path.relative_to(SRC.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_imports(source: str, importer: str) -> list[str]:
    """`from execwatch.X import _name`, or from a private module of X, where X is not the
    importer's own package: (line, module, names) as text."""
    own = package_of(importer)
    found = []
    for node in ast.walk(ast.parse(source)):
        module = node.module or "" if isinstance(node, ast.ImportFrom) else ""
        if not module.startswith("execwatch") or package_of(module) == own:
            continue
        assert isinstance(node, ast.ImportFrom)
        names = [a.name for a in node.names if is_private(a.name)]
        if names or any(is_private(part) for part in module.split(".")):
            found.append(f"{node.lineno}: from {module} import {', '.join(names) or '...'}")
    return found


def test_no_package_imports_another_packages_private_names() -> None:
    found = {
        str(path.relative_to(SRC.parent)): hits
        for path in sorted(SRC.rglob("*.py"))
        if (hits := private_imports(path.read_text(), module_name(path)))
    }
    assert found == {}


def test_what_the_check_catches_and_lets_through() -> None:
    source = (
        "from execwatch.scan.runner import _scan_image\n"
        "from execwatch.scan._impl import helper\n"
        "from execwatch.audit.inventory import _own_package\n"
        "from execwatch import __version__\n"
        "from execwatch.scan import scan_image\n"
    )
    assert private_imports(source, "execwatch.audit.engine") == [
        "1: from execwatch.scan.runner import _scan_image",
        "2: from execwatch.scan._impl import ...",
    ]


def imported_packages(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    modules = {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    modules |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    return {package_of(m) for m in modules if m.startswith("execwatch.")}


def test_the_neutral_package_imports_neither_of_its_users() -> None:
    """runnable/ is what scan and diagnosis share: it depends on neither, and the node's
    diagnosis does not load the scanner (its registry client, decompressors) either."""
    for path in sorted((SRC / "runnable").rglob("*.py")):
        assert not imported_packages(path) & {"scan", "diagnosis"}, path
    for path in sorted((SRC / "diagnosis").rglob("*.py")):
        assert "scan" not in imported_packages(path), path


# The layers, as each package may import (besides itself). A command's `cli.py` (and
# execwatch/cli.py) is where parts are assembled: it may import any package. Two data paths:
# kernel event -> diagnosis -> attribution -> record -> Event/metric (probe, diagnosis,
# pipeline, node, agent, handler) and image -> layers -> verdict (scan, audit, placement),
# over the shared vocabulary (record, runnable, binfmt) and the client layer (kube).
ALLOWED: dict[str, set[str]] = {
    "text": set(),
    "logs": {"text"},
    "rlimits": set(),
    "binfmt": {"text"},
    "runnable": {"binfmt", "rlimits", "text"},
    "record": {"binfmt", "runnable", "text"},
    "kube": {"text"},
    "crd": {"kube", "record", "text"},
    # Option types parse with their part's own parser, imported when the option is used.
    "cliargs": {"binfmt", "crd", "scan", "text"},
    "serving": {"cliargs", "kube", "text"},
    "attribution": {"binfmt", "kube", "record", "text"},
    "probe": {"attribution", "binfmt", "record", "runnable", "text"},
    "diagnosis": {"attribution", "binfmt", "probe", "record", "rlimits", "runnable", "text"},
    "pipeline": {"attribution", "diagnosis", "probe", "record", "text"},
    "node": {
        "attribution",
        "binfmt",
        "cliargs",
        "diagnosis",
        "pipeline",
        "probe",
        "record",
        "serving",
        "text",
    },
    "agent": {"attribution", "crd", "kube", "node", "pipeline", "probe", "record", "text"},
    "handler": {"attribution", "binfmt", "crd", "kube", "record", "runnable", "text"},
    "scan": {"binfmt", "cliargs", "record", "rlimits", "runnable", "text"},
    "smoke": {"binfmt", "runnable", "scan", "text"},
    "audit": {"binfmt", "cliargs", "kube", "record", "runnable", "scan", "text"},
    "placement": {
        "binfmt",
        "cliargs",
        "crd",
        "kube",
        "record",
        "runnable",
        "scan",
        "serving",
        "text",
    },
}


def imported_modules(source: str) -> set[str]:
    """Every execwatch module `source` imports, at the top or inside a function."""
    modules: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            base = node.module
            modules.add(base)
            if base == "execwatch":
                modules |= {f"execwatch.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            modules |= {a.name for a in node.names}
    return {m for m in modules if m.startswith("execwatch.")}


def against_the_layers(source: str, importer: str) -> list[str]:
    own = package_of(importer)
    if importer in ("execwatch", "execwatch.cli") or importer.endswith(".cli"):
        return []
    allowed = ALLOWED[own] | {own, "__version__"}
    return sorted(m for m in imported_modules(source) if package_of(m) not in allowed)


def test_no_module_imports_against_the_layers() -> None:
    found = {
        module_name(path): hits
        for path in sorted(SRC.rglob("*.py"))
        if (hits := against_the_layers(path.read_text(), module_name(path)))
    }
    assert found == {}


def test_every_package_has_its_place_in_the_layers() -> None:
    packages = {package_of(module_name(p)) for p in SRC.rglob("*.py")}
    assert packages - {"cli", "__init__", "execwatch"} == set(ALLOWED)


def test_what_the_layering_check_catches() -> None:
    source = (
        "from execwatch.kube.client import Rest\n"
        "def later():\n"
        "    from execwatch.placement.observed import Feedback\n"
        "from execwatch import crd\n"
    )
    assert against_the_layers(source, "execwatch.handler.controller") == [
        "execwatch.placement.observed"
    ]
    assert against_the_layers(source, "execwatch.handler.cli") == []
    assert against_the_layers("from execwatch import crd\n", "execwatch.kube.watch") == [
        "execwatch.crd"
    ]


# Names two packages use for the same meaning, each for its own part, with the reason.
SAME_MEANING_MODULES = {
    "__init__.py": "a package",
    "cli.py": "a command's options and main",
    "metrics.py": "a part's Prometheus metrics",
    "errors.py": "a package's exceptions",
    "client.py": "a package's client of its API: kube's API server, attribution's CRI runtime",
    "controller.py": "a control loop: the handler's over records, placement's over gated pods",
}
SAME_MEANING_CLASSES = {
    # the Protocol of what the executor calls, which attribution.Attributor meets
    "Attributor": "pipeline.executor, attribution.attributor",
}


def shared_names(named: list[tuple[str, str]], allowed: Collection[str]) -> dict[str, list[str]]:
    """Each (name, where) whose name stands in more than one place and is not allowed."""
    places: dict[str, set[str]] = {}
    for name, where in named:
        places.setdefault(name, set()).add(where)
    return {n: sorted(w) for n, w in places.items() if len(w) > 1 and n not in allowed}


def public_classes(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    return [n.name for n in tree.body if isinstance(n, ast.ClassDef) and not is_private(n.name)]


def test_no_two_modules_of_different_packages_share_a_file_name() -> None:
    named = [(p.name, package_of(module_name(p))) for p in SRC.rglob("*.py")]
    assert shared_names(named, SAME_MEANING_MODULES) == {}


def test_no_two_public_classes_share_a_name() -> None:
    named = [(c, module_name(p)) for p in SRC.rglob("*.py") for c in public_classes(p)]
    assert shared_names(named, SAME_MEANING_CLASSES) == {}


def test_what_the_name_checks_catch() -> None:
    named = [("Budget", "probe.layout"), ("Budget", "scan.sources"), ("Limits", "runnable")]
    assert shared_names(named, {}) == {"Budget": ["probe.layout", "scan.sources"]}
    assert shared_names(named, {"Budget": "why"}) == {}
    assert shared_names([("cli.py", "scan"), ("cli.py", "scan")], {}) == {}
