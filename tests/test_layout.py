"""Where test code lives: the harnesses several test packages or the benchmarks share are
in tests/support/<concern>/, each under a file name of its own, and they and the
benchmarks import only tests/support (never a test module, a conftest or another test
package's helpers)."""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
SUPPORT = TESTS / "support"
BENCHMARKS = REPO / "benchmarks"

# Any line that imports from the `tests` package, also inside a string (a benchmark hands
# its child process a script): `from tests.x import y`, `from tests import x`, `import tests.x`.
IMPORT = re.compile(
    r"^\s*(?:from\s+(?P<base>tests(?:\.\w+)*)\s+import\s+\(?\s*(?P<name>\w+)"
    r"|import\s+(?P<module>tests(?:\.\w+)*))",
    re.MULTILINE,
)


def imported_test_modules(source: str) -> list[str]:
    """The modules of the `tests` package a source imports, by name (`from tests import x`
    names tests.x)."""
    found = []
    for match in IMPORT.finditer(source):
        if match["module"]:
            found.append(match["module"])
        elif match["base"] == "tests":
            found.append(f"tests.{match['name']}")
        else:
            found.append(match["base"])
    return found


def outside_support(source: str) -> list[str]:
    return [
        m
        for m in imported_test_modules(source)
        if m != "tests.support" and not m.startswith("tests.support.")
    ]


def shared_file_names(paths: list[Path]) -> dict[str, list[str]]:
    """File name -> the paths that share it (`__init__.py` aside)."""
    by_name: defaultdict[str, list[str]] = defaultdict(list)
    for path in paths:
        if path.name != "__init__.py":
            by_name[path.name].append(str(path.relative_to(REPO)))
    return {name: where for name, where in by_name.items() if len(where) > 1}


def imports_outside_support(root: Path) -> dict[str, list[str]]:
    return {
        str(path.relative_to(REPO)): hits
        for path in sorted(root.rglob("*.py"))
        if (hits := outside_support(path.read_text()))
    }


def test_benchmarks_import_only_tests_support() -> None:
    assert imports_outside_support(BENCHMARKS) == {}


def test_the_shared_harnesses_import_only_tests_support() -> None:
    assert imports_outside_support(SUPPORT) == {}


def test_no_two_modules_under_tests_support_share_a_file_name() -> None:
    assert shared_file_names(sorted(SUPPORT.rglob("*.py"))) == {}


def test_every_shared_harness_is_in_a_concern_of_its_own() -> None:
    loose = [p.name for p in SUPPORT.glob("*.py") if p.name not in ("__init__.py", "wait.py")]
    assert loose == []


def test_what_the_layout_checks_catch() -> None:
    source = (
        "from tests.support.kube.apiserver import KubeCluster\n"
        "from tests.support import wait\n"
        "from tests.scan.test_checks import glibc_base\n"
        "from tests.conftest import FOREIGN\n"
        "from tests import gotools\n"
        "import tests.kernels.vm as vm\n"
        'CHILD = """\n'
        "from tests.binfmt.test_scaling import (\n"
        "    verdef_long_name,\n"
        ')"""\n'
        "from testsuite.x import y\n"
    )
    assert outside_support(source) == [
        "tests.scan.test_checks",
        "tests.conftest",
        "tests.gotools",
        "tests.kernels.vm",
        "tests.binfmt.test_scaling",
    ]
    paths = [
        SUPPORT / "kube" / "__init__.py",
        SUPPORT / "node" / "__init__.py",
        SUPPORT / "kube" / "cluster.py",
        SUPPORT / "placement" / "cluster.py",
        SUPPORT / "node" / "stack_runner.py",
    ]
    assert shared_file_names(paths) == {
        "cluster.py": ["tests/support/kube/cluster.py", "tests/support/placement/cluster.py"]
    }
