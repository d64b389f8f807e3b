"""Which side limited a validation run (spark_jobs.cpu_figures): the broker or its clients, by the CPU each used."""

from spark_jobs.cpu_figures import BROKER, CLIENTS, UNKNOWN, cpu_figures


def facts(broker, clients, wall=10.0):
    return {"cpu": {"broker_seconds": broker, "client_seconds": clients, "wall_seconds": wall}}


def test_the_side_that_used_more_cpu_is_the_limit():
    pika_like = cpu_figures(facts(broker=6.0, clients=14.0))
    assert pika_like["limit"] == CLIENTS
    assert (pika_like["broker_cores"], pika_like["client_cores"]) == (0.6, 1.4)
    fast = cpu_figures(facts(broker=9.5, clients=3.0))
    assert fast["limit"] == BROKER and fast["broker_cores"] == 0.95


def test_without_the_brokers_figure_the_limit_is_unknown():
    # A reference broker elsewhere, or an incarnation that died unseen: no broker CPU to compare with.
    assert cpu_figures(facts(broker=None, clients=3.0))["limit"] == UNKNOWN
    assert cpu_figures({})["limit"] == UNKNOWN  # a run.json from before the figures were recorded
    assert cpu_figures(facts(broker=-1, clients=3.0))["broker_seconds"] is None
    assert cpu_figures(facts(broker=True, clients=3.0))["limit"] == UNKNOWN


def test_a_run_of_no_length_has_no_cores_figure():
    figures = cpu_figures(facts(broker=1.0, clients=0.5, wall=0))
    assert figures["broker_cores"] is None and figures["limit"] == BROKER
