"""Reading a broker's Prometheus metrics as a Prometheus server reads them."""

import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def scrape(broker, path="/metrics"):
    """name -> [(labels, value)] of every sample at C{path}, as a Prometheus server reads them."""
    host, port = broker.wait_address("Prometheus metrics")
    with urllib.request.urlopen(f"http://{host}:{port}{path}", timeout=10) as response:
        assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = response.read().decode("utf-8")
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((sample.labels, sample.value))
    return samples


def value(samples, name, **labels):
    """The one sample of C{name} with exactly C{labels}."""
    found = [sample_value for sample_labels, sample_value in samples.get(name, ()) if sample_labels == labels]
    assert len(found) == 1, (name, labels, samples.get(name))
    return found[0]
