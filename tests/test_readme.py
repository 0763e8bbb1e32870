"""The README's python blocks run as written (in a scratch directory)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
RUNNABLE = [b for b in BLOCKS if "lb.ReplayBuffer.open(" in b and "..." not in b]


def test_readme_has_a_quick_start():
    assert RUNNABLE, "the README must hold at least one runnable python block"
    lines = [ln for ln in RUNNABLE[0].strip().splitlines() if ln.strip()]
    assert len(lines) <= 30


@pytest.mark.parametrize("block", RUNNABLE, ids=[f"block{i}" for i in range(len(RUNNABLE))])
def test_readme_block_runs(block, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    exec(compile(block, str(README), "exec"), {"__name__": "__readme__"})
    out = capsys.readouterr().out
    assert "policy_version" in out or out == ""
