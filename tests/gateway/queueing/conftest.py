import pytest

from tests.gateway.queueing.harness import ManualClock


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()
