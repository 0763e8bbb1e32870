"""constraints.txt pins one tested version of every package the install lines pull; a requirement of
pyproject.toml or requirements-integration.txt that a pin does not satisfy would make pip fail (or,
without the file, backtrack for minutes), so it is caught here, without a network."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]


def _pins() -> dict[str, Version]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"constraints.txt: {line!r} is not an exact pin"
            pins[canonicalize_name(name)] = Version(version)
    return pins


def _requirements() -> list[Requirement]:
    """What `make test`, `make test-integration` and `make bench` install into one venv."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = [Requirement(r) for r in project["dependencies"]]
    for extra in ("dev", "bench"):
        reqs += [Requirement(r) for r in project["optional-dependencies"][extra]]
    for line in (ROOT / "requirements-integration.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            reqs.append(Requirement(line))
    return reqs


def test_every_pin_satisfies_the_requirements_that_name_it():
    pins = _pins()
    assert {"boto3", "botocore", "aiobotocore", "s3fs", "moto", "ray", "transferqueue"} <= set(pins)
    unmet = []
    for req in _requirements():
        name = canonicalize_name(req.name)
        if name == "torch":  # pinned by the Makefile line itself (the CPU wheel)
            continue
        if name not in pins:
            unmet.append(f"{req} is not pinned in constraints.txt")
        elif not req.specifier.contains(pins[name], prereleases=True):
            unmet.append(f"{req} excludes the pin {name}=={pins[name]}")
    assert not unmet, "; ".join(unmet)


@pytest.mark.slow
def test_every_install_line_resolves_together_with_the_pins():
    """pip's own resolver over the union of the install lines (the package registry, nothing installed):
    a pin that a *transitive* requirement excludes (torchrl 0.14.1 wants tensordict < 0.15) fails here,
    which the direct-requirement check above cannot see."""
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "-q", "-c", "constraints.txt",
         "torch==2.13.0", "-e", ".[dev,bench]", "-r", "requirements-integration.txt"],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    errors = [line for line in done.stderr.splitlines() if line.startswith("ERROR")]
    assert done.returncode == 0, "\n".join(errors) or done.stderr[-2000:]
