"""Cluster mode's options: off unless --cluster-etcd is given, and every bad value refused with one
line naming the option, before anything starts."""

import pytest
from twisted.python import usage

from brokerd.process.cluster_options import cluster_settings
from brokerd.process.tap import Options


def parsed(tmp_path, *args):
    options = Options()
    options.parseOptions(["--data-dir", str(tmp_path), *args])
    return options


def test_without_cluster_etcd_a_node_runs_alone(tmp_path):
    assert parsed(tmp_path)["cluster"] is None


def test_cluster_settings_are_read(tmp_path):
    settings = parsed(tmp_path, "--cluster-etcd", "http://127.0.0.1:2379, http://127.0.0.2:2379",
                      "--cluster-name", "c1", "--node-name", "n1", "--cluster-min-isr", "2",
                      "--cluster-lease-ttl", "6", "--cluster-max-lag-bytes", "1M",
                      "--cluster-max-lag-seconds", "2.5")["cluster"]
    assert settings.etcd_urls == ("http://127.0.0.1:2379", "http://127.0.0.2:2379")
    assert (settings.cluster_name, settings.node_name, settings.min_isr) == ("c1", "n1", 2)
    assert (settings.lease_ttl, settings.max_lag_bytes, settings.max_lag_seconds) == (6.0, 1 << 20, 2.5)


@pytest.mark.parametrize("args, named", [
    (["--cluster-etcd", "127.0.0.1:2379"], "--cluster-etcd: '127.0.0.1:2379' is not an http"),
    (["--cluster-etcd", "http://127.0.0.1:2379", "--cluster-min-isr", "0"], "--cluster-min-isr: '0'"),
    (["--cluster-etcd", "http://127.0.0.1:2379", "--cluster-lease-ttl", "soon"], "--cluster-lease-ttl: 'soon'"),
    (["--cluster-etcd", "http://127.0.0.1:2379", "--node-name", "no/slash"], "--node-name: node name 'no/slash'"),
    (["--cluster-etcd", "http://127.0.0.1:2379", "--cluster-name", ""], "--cluster-name: cluster name ''"),
    (["--cluster-etcd", "http://127.0.0.1:2379", "--cluster-max-lag-bytes", "lots"], "--cluster-max-lag-bytes:"),
])
def test_bad_values_are_refused_naming_the_option(tmp_path, args, named):
    with pytest.raises((SystemExit, usage.UsageError)) as refused:
        parsed(tmp_path, *args)
    assert named in str(refused.value)


def test_the_settings_of_options_without_etcd_are_none():
    assert cluster_settings({"cluster-etcd": None}) is None
