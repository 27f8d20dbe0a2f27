"""The chaos suite's short form: every scenario of `scenarios.py` against the real
gateway process; nothing lost, and the gateway's RSS and file descriptors back within
10 % of where they started (`python -m tests.chaos` runs the full form)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chaos.__main__ import run_suite, within
from tests.chaos.suite import Line


@pytest.mark.slow
async def test_no_fault_loses_a_request_or_leaks(tmp_path: Path) -> None:
    lines: list[Line] = []
    rss, fds = await run_suite(True, tmp_path, lines)

    assert [line.name for line in lines if line.lost] == [], "\n".join(map(str, lines))
    assert all(within(line.rss_after, rss) for line in lines), "\n".join(map(str, lines))
    assert all(within(line.fds_after, fds) for line in lines), "\n".join(map(str, lines))
    assert all(line.sent for line in lines)
