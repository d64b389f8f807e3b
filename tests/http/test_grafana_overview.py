"""RabbitMQ's own "RabbitMQ-Overview" Grafana dashboard (tests/http/data, RabbitMQ 3.10.8's, MPL 2.0) on brokerd's
metrics: every panel that applies shows data, and every rate panel a rate above zero.

A real broker is scraped at C{/metrics} before and after a workload of pika clients (publishes with confirms,
unroutable ones dropped and returned, basic.get with and without acks and on an empty queue, consumers with and
without acks, a redelivery, queues and channels and connections opened and closed). The two scrapes become
Prometheus series, sampled every 15 s as a server would scrape them (labelled with the C{instance} and C{job} a
server adds), and Prometheus' own C{promtool test rules} evaluates each panel's query at the end of a minute, with
the dashboard's variables given the values Grafana would: C{$rabbitmq_cluster} the cluster the metrics name,
C{$namespace} none. C{.ci/run} takes promtool from Debian's prometheus package; without it the module is skipped.
"""

import json
import pathlib
import re
import shutil
import subprocess
import sys
import urllib.request

import pika
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.httpapi import module_broker

DASHBOARD = pathlib.Path(__file__).parent / "data" / "RabbitMQ-Overview.json"
PROMTOOL = shutil.which("promtool") or shutil.which("promtool", path=str(pathlib.Path(sys.executable).parent))
SCRAPE_INTERVAL = 15  # seconds between the samples promtool is given
# The panels that do not apply to brokerd, each with why.
NOT_APPLICABLE = {}
# Rate panels that show data but may rightly show zero after the workload.
ZERO_ALLOWED = {
    "Messages unconfirmed to publishers / s":
        "the rate of publishes expecting a confirm minus that of confirms: zero once every publish is confirmed",
}

pytestmark = pytest.mark.skipif(PROMTOOL is None, reason="promtool (Debian: prometheus package) is not installed here")


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    yield from module_broker(tmp_path_factory, "--prometheus", "tcp:0:interface=127.0.0.1")


def scrape(broker):
    """C{(series text, value)} of every sample of C{/metrics}, as a Prometheus server would store it."""
    host, port = broker.wait_address("Prometheus metrics")
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as response:
        text = response.read().decode("utf-8")
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = {**sample.labels, "instance": "brokerd:15692", "job": "rabbitmq"}
            written = ",".join(f'{name}="{escape(value)}"' for name, value in sorted(labels.items()))
            samples[f"{sample.name}{{{written}}}"] = sample.value
    return samples


def escape(value):
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def workload(broker):
    """What the dashboard's panels count: publishes, confirms, returns, gets, deliveries, acks and churn."""
    host, port = broker.wait_address("AMQP")
    parameters = pika.ConnectionParameters(host, port, connection_attempts=1, socket_timeout=10)
    with pika.BlockingConnection(parameters) as connection:
        channel = connection.channel()
        channel.confirm_delivery()
        for queue in ("grafana.work", "grafana.auto", "grafana.empty"):
            channel.queue_declare(queue)
        for number in range(6):
            channel.basic_publish("", "grafana.work", b"work %d" % number)
            channel.basic_publish("", "grafana.auto", b"auto %d" % number)
        channel.basic_publish("", "grafana.nowhere", b"dropped")
        with pytest.raises(pika.exceptions.UnroutableError):
            channel.basic_publish("", "grafana.nowhere", b"returned", mandatory=True)
        method, _, _ = channel.basic_get("grafana.work")
        channel.basic_nack(method.delivery_tag, requeue=True)
        method, _, _ = channel.basic_get("grafana.work")
        assert method.redelivered
        channel.basic_ack(method.delivery_tag)
        assert channel.basic_get("grafana.work", auto_ack=True)[0] is not None
        assert channel.basic_get("grafana.empty")[0] is None
        delivered = []
        channel.basic_consume("grafana.work", lambda ch, method, properties, body: (
            delivered.append(method), ch.basic_ack(method.delivery_tag)))
        channel.basic_consume("grafana.auto", lambda ch, method, properties, body: delivered.append(method),
                              auto_ack=True)
        while len(delivered) < 10:
            connection.process_data_events(time_limit=1)
        channel.queue_declare("grafana.churn")
        channel.queue_delete("grafana.churn")
        connection.channel().close()
    with pika.BlockingConnection(parameters) as short:
        short.channel().basic_publish("", "grafana.auto", b"from a short connection")


def input_series(before, after):
    """promtool's input series: each sample's value before until the workload, its value after from then on."""
    series = []
    for name in sorted(set(before) | set(after)):
        old, new = before.get(name), after.get(name)
        values = [old, old, new, new, new]  # at 0, 15, 30, 45 and 60 s; the workload ran between 15 and 30 s
        series.append({"series": name, "values": " ".join("_" if value is None else repr(value) for value in values)})
    return series


def panels(dashboard):
    """(title, [query]) of every panel, those inside rows included."""
    for panel in dashboard["panels"]:
        yield from panels(panel) if "panels" in panel else ()
        queries = [target["expr"] for target in panel.get("targets", ()) if target.get("expr")]
        if queries:
            yield panel.get("title") or panel["type"], queries


def grafana_variables(query, cluster):
    """The query as Grafana sends it: the dashboard's variables replaced by their values."""
    for variable, value in (("$rabbitmq_cluster", cluster), ("$namespace", ""), ("$__rate_interval", "60s"),
                            ("$__interval", f"{SCRAPE_INTERVAL}s")):
        query = query.replace(variable, value)
    return query


def test_every_applicable_panel_of_rabbitmqs_overview_dashboard_shows_data(broker, tmp_path):
    before = scrape(broker)
    workload(broker)
    after = scrape(broker)
    cluster = next(name.split('rabbitmq_cluster="')[1].split('"')[0] for name in after
                   if name.startswith("rabbitmq_identity_info{"))
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    titles, checks = set(), []
    for title, queries in panels(dashboard):
        titles.add(title)
        if title in NOT_APPLICABLE:
            continue
        for query in queries:
            query = grafana_variables(query, cluster)
            # The check's number when the query gives a sample (a rate panel: a sample above zero), else nothing.
            shown = query if "rate(" not in query or title in ZERO_ALLOWED else f"({query}) > 0"
            checks.append((title, query, f"count({shown}) * 0 + {len(checks) + 1}"))
    assert set(NOT_APPLICABLE) | set(ZERO_ALLOWED) <= titles  # the lists name panels the dashboard has
    assert len(checks) >= 40
    tests = {"rule_files": [], "evaluation_interval": "1m", "tests": [{
        "interval": f"{SCRAPE_INTERVAL}s",
        "input_series": input_series(before, after),
        "promql_expr_test": [{"expr": check, "eval_time": "1m", "exp_samples": [{"labels": "{}", "value": number}]}
                             for number, (_, _, check) in enumerate(checks, 1)],
    }]}
    path = tmp_path / "dashboard-tests.yml"
    path.write_text(json.dumps(tests, indent=1), encoding="utf-8")  # JSON is YAML
    finished = subprocess.run([PROMTOOL, "test", "rules", str(path)], capture_output=True, text=True, timeout=120)
    failed = {int(float(number)) for number in re.findall(r"exp: \{\} (\S+)", finished.stdout + finished.stderr)}
    empty = [f"{title}: {query}" for number, (title, query, _) in enumerate(checks, 1) if number in failed]
    assert finished.returncode == 0, "panels without data:\n" + "\n".join(empty) + "\n" + finished.stderr[-2000:]
