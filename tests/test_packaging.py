"""The wheel ships every module and resource: pyproject's explicit package list and data globs cover
the tree (a subpackage missing there installs fine editable and breaks only from a built wheel)."""

from __future__ import annotations

import fnmatch
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def _package_dirs() -> dict[str, Path]:
    mapped = {name: ROOT / d for name, d in CONFIG.get("package-dir", {}).items()}
    return {name: mapped.get(name, ROOT / name.replace(".", "/")) for name in CONFIG["packages"]}


def test_every_python_package_under_lakebuffer_is_listed():
    listed = {p.resolve() for p in _package_dirs().values()}
    found = {p.parent.resolve() for p in (ROOT / "lakebuffer").rglob("*.py") if "__pycache__" not in p.parts}
    missing = sorted(str(d.relative_to(ROOT)) for d in found - listed)
    assert not missing, f"add these to [tool.setuptools] packages in pyproject.toml: {missing}"
    for d in found:
        assert (d / "__init__.py").is_file(), f"{d} has modules but no __init__.py"


def test_every_resource_file_is_covered_by_package_data():
    data = CONFIG["package-data"]
    for name, directory in _package_dirs().items():
        if name not in data:
            continue
        for f in directory.rglob("*"):
            if f.suffix in (".sql", ".json", ".yaml") and "__pycache__" not in f.parts:
                rel = f.relative_to(directory).as_posix()
                assert any(fnmatch.fnmatch(rel, g) and rel.count("/") == g.count("/") for g in data[name]), (
                    f"{name}: {rel} is not shipped by package-data {data[name]}")
