"""One test, two sizes: a small run in `make test`, the full run in `make test-slow` (issue 26).

Crash loops, memory runs and exit loops are worth running at full size, but not between every change:
``fast_and_full("kills", 3, 20)`` parametrizes a test with the small value (id ``fast``) and the full
value marked ``slow`` (id ``full``), so the same assertions run at both sizes.
"""

from __future__ import annotations

import pytest


def fast_and_full(name: str, fast: object, full: object) -> pytest.MarkDecorator:
    """Parametrize ``name`` with ``fast`` for `make test` and ``full`` (marked slow) for `make test-slow`."""
    return pytest.mark.parametrize(name, [pytest.param(fast, id="fast"), pytest.param(full, id="full", marks=pytest.mark.slow)])
