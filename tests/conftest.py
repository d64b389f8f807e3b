"""pytest fixtures shared by the synchronous model and channel tests, and the
order the suite's modules are handed to the xdist workers in."""

import pytest

from tests.support.broker import make_broker


def pytest_collection_modifyitems(items):
    """
    Puts the modules marked C{long_module(seconds=N)} first, longest first, the
    rest after them in their usual order. With C{--dist loadscope} a module is
    one unit of work for one worker and units go out in this order, so the
    long modules start at once while the other worker takes the many short
    ones, rather than one worker running a long module alone at the end.
    """
    def seconds(item):
        marker = item.get_closest_marker("long_module")
        return marker.kwargs["seconds"] if marker else 0

    items.sort(key=lambda item: -seconds(item))  # stable: each module's tests keep their order


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
