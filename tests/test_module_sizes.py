"""No module of cgc, cgc.runtime or cgc.plan_schema grows past ``LIMIT`` lines.

A module that long holds several things (DESIGN.md: small modules named for what they
hold); split it along its seams. ``EXCEPTIONS`` names the modules that are over the limit
today, each with why it has not been split yet. The list only shrinks: an entry whose
module is back under the limit, or gone, fails the test until it is removed, and a new
module over the limit fails it too. Generated protobuf modules (``*_pb2.py``) are not
counted. Lines are counted as ``wc -l`` counts them.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 600
# The source folders of the installed packages cgc, cgc.runtime and cgc.plan_schema.
PACKAGE_DIRS = ("cgc", "runtime", "plan_schema")

# Module (path from the checkout root) -> why it is still over LIMIT. Remove an entry as
# soon as its module is split; never add one for a module that could be split.
EXCEPTIONS: dict[str, str] = {
}


def _line_count(path: Path) -> int:
    """Lines of ``path`` as ``wc -l`` counts them (newline characters)."""
    return path.read_bytes().count(b"\n")


def _module_sizes() -> dict[str, int]:
    """Every counted module -> its line count."""
    sizes = {}
    for folder in PACKAGE_DIRS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path.name.endswith("_pb2.py") or "__pycache__" in path.parts:
                continue
            sizes[path.relative_to(ROOT).as_posix()] = _line_count(path)
    return sizes


def test_the_scan_sees_the_packages() -> None:
    # A scan that found nothing (a moved folder, a wrong ROOT) would pass every check below.
    sizes = _module_sizes()
    for folder in PACKAGE_DIRS:
        assert any(p.startswith(folder + "/") for p in sizes), f"no module found under {folder}/"
    assert "runtime/actor/executor.py" in sizes and sizes["runtime/actor/executor.py"] > 100


def test_every_module_is_within_the_limit() -> None:
    over = {p: n for p, n in _module_sizes().items() if n > LIMIT and p not in EXCEPTIONS}
    assert not over, "modules over the limit of {} lines (split them along their seams): {}".format(
        LIMIT, ", ".join(f"{p} ({n} lines)" for p, n in sorted(over.items())))


def test_the_exception_list_only_shrinks() -> None:
    sizes = _module_sizes()
    stale = []
    for path, reason in EXCEPTIONS.items():
        assert reason.strip() and "\n" not in reason, f"{path}: give a one-line reason"
        if path not in sizes:
            stale.append(f"{path} is gone")
        elif sizes[path] <= LIMIT:
            stale.append(f"{path} is {sizes[path]} lines, within the limit of {LIMIT}")
    assert not stale, ("test_module_sizes.EXCEPTIONS: " + "; ".join(stale)
                       + ": remove it from the list")


# Product lines per package (issue 46 item 5, as tinygrad's line counter): the sum of the
# modules counted above under each folder. A package over its budget fails; a budget far above
# its package fails too, so the budgets only come down (lower the number to the new size when
# a change shrinks a package). The target for runtime/ is 13,500.
PACKAGE_BUDGETS: dict[str, int] = {
    "cgc": 12_800,
    "plan_schema": 5_750,
    "runtime": 16_800,
}
SLACK = 300  # lines a package may sit under its budget before the budget must come down


def _package_lines() -> dict[str, int]:
    """Each folder of PACKAGE_BUDGETS -> the lines of its counted modules."""
    sizes = _module_sizes()
    return {pkg: sum(n for p, n in sizes.items() if p.startswith(pkg + "/"))
            for pkg in PACKAGE_BUDGETS}


def test_every_package_is_within_its_line_budget() -> None:
    over = {p: n for p, n in _package_lines().items() if n > PACKAGE_BUDGETS[p]}
    assert not over, "packages over their line budget (make room before adding): " + ", ".join(
        f"{p}: {n} lines, budget {PACKAGE_BUDGETS[p]}" for p, n in sorted(over.items()))


def test_the_budgets_follow_the_packages_down() -> None:
    loose = {p: n for p, n in _package_lines().items() if n < PACKAGE_BUDGETS[p] - SLACK}
    assert not loose, "lower test_module_sizes.PACKAGE_BUDGETS to the package's size: " + (
        ", ".join(f"{p}: {n} lines, budget {PACKAGE_BUDGETS[p]}" for p, n in sorted(loose.items())))
