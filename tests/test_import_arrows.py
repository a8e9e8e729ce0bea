"""Stages point one way (docs/ARCHITECTURE.md): this walks every import of the source tree and
fails on an arrow back: kernels are a leaf; heads (the target, the heads, calibration maths)
import neither data nor train nor eval; the export stage does not import train, and of eval only
the leaves it reads (the eval settings, the verdict); eval does not import train; data imports
neither train nor eval. Leaves import nothing of ours."""

import ast
from pathlib import Path

ROOT = Path(__file__).parent.parent
PACKAGES = ("data", "heads", "train", "eval", "kernels")
FORBIDDEN = {  # importer (module prefix) -> packages it must not import
    "kernels": {"data", "heads", "train", "eval"},
    "heads.export": {"data", "train", "eval"},
    "heads": {"data", "train", "eval"},
    "eval": {"train"},
    "data": {"train", "eval"},
}
# Leaf modules (they import nothing of ours) that an importer may read across a forbidden arrow.
LEAVES_ACROSS = {"heads.export": {"eval.config", "eval.verdict"}}
LEAVES = ("eval/config.py", "eval/verdict.py", "heads/export/config.py")


def imported_modules(path: Path) -> set[str]:
    """Every module of ours that path imports, by dotted name."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return {name for name in names if name.split(".")[0] in PACKAGES}


def imported_packages(path: Path, allowed: set[str] = frozenset()) -> set[str]:
    """The packages of ours that path imports, not counting the `allowed` modules."""
    return {name.split(".")[0] for name in imported_modules(path) - allowed}


def rule_for(module: str) -> set[str]:
    """The most specific rule: heads.export's, else heads', and so on."""
    prefix = max((p for p in FORBIDDEN if module == p or module.startswith(p + ".")), key=len)
    return FORBIDDEN[prefix]


def test_no_import_points_back_up_the_stages():
    back = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            if package == "train":
                continue  # train runs the stages: it may import any of them
            allowed = next((v for k, v in LEAVES_ACROSS.items() if module.startswith(k + ".")), set())
            for name in sorted(imported_packages(path, allowed) & rule_for(module)):
                back.append(f"{module} imports {name}")
    assert not back, back


def test_leaves_import_nothing_of_ours():
    assert {leaf: imported_modules(ROOT / leaf) for leaf in LEAVES} == {leaf: set() for leaf in LEAVES}


def test_the_walk_sees_imports():
    """A check that finds nothing because it reads nothing would pass too."""
    assert imported_packages(ROOT / "eval" / "calibration.py") >= {"heads"}
    assert rule_for("heads.export.job") == {"data", "train", "eval"}
    assert imported_packages(ROOT / "heads" / "export" / "job.py") >= {"eval"}  # eval.verdict, a leaf
