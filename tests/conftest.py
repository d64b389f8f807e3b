"""pytest fixtures shared by the synchronous model and channel tests."""

import pytest

from tests.support import make_broker


@pytest.fixture
def broker_and_clock():
    """A broker on a memory store and the Clock it schedules on."""
    return make_broker()


@pytest.fixture
def broker(broker_and_clock):
    return broker_and_clock[0]


@pytest.fixture
def clock(broker_and_clock):
    return broker_and_clock[1]
