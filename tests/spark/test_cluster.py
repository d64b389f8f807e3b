"""The validation's Spark job on a standalone Spark cluster: one master and one
worker started from pyspark's own C{spark-class} on loopback, and the one
command run unchanged with C{--master spark://...} over synthetic runs
(tests/support/spark_events.py, one with a lost message planted). Its summary must be
the one local mode gives for the same runs: verdict, counts, checks with
their examples, throughput and latency.

The runs are checked with C{--reuse-runs --keep-exports}, so only the Spark
job runs. The local-mode run starts first and goes on while the cluster
starts and runs the job (one after the other, the module takes half as long
again); both daemons are stopped (their process groups killed) whatever the
test's outcome.
"""

import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import urllib.request
from dataclasses import dataclass

import pyspark
import pytest

from brokerd.testing import poll_until
from tests.support.paths import ROOT
from tests.support.spark_driver import spark_environment
from tests.support.spark_events import SyntheticRun

pytestmark = pytest.mark.long_module(seconds=80)  # started early (tests/conftest.py)

SPARK_HOME = pathlib.Path(pyspark.__file__).resolve().parent
LABELS = ("sqlite", "filelog", "chunked")
LOST_IN = "filelog"
START_SECONDS = 120  # generous: the machine may be busy with other work
JOB_SECONDS = 300
MASTER_URL = re.compile(r"Starting Spark master at (spark://\S+)")
WEB_UI_PORT = re.compile(r"Successfully started service 'MasterUI' on port (\d+)")
# The C1 compiler alone for every JVM of the cluster, as for the tests' drivers (tests/support/spark_driver.py).
QUICK_JVM = "-XX:TieredStopAtLevel=1"


def daemon_environment(tmp):
    """The daemons' environment: pyspark's Spark, loopback only, an empty configuration directory."""
    conf = tmp / "conf"
    conf.mkdir(exist_ok=True)
    return {**os.environ, "SPARK_HOME": str(SPARK_HOME), "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_CONF_DIR": str(conf),
            "SPARK_DAEMON_JAVA_OPTS": QUICK_JVM,
            # Its REST submission server would take the fixed port 6066.
            "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false"}


class SparkDaemon:
    """A standalone Spark daemon (master or worker) run by C{spark-class} as a child process in its own
    process group (its executors included), its output in a log file."""

    def __init__(self, name, class_name, arguments, tmp):
        self.name = name
        self.log_path = tmp / f"{name}.log"
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [str(SPARK_HOME / "bin" / "spark-class"), f"org.apache.spark.deploy.{class_name}", *arguments],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=daemon_environment(tmp),
                start_new_session=True)

    def log(self):
        return self.log_path.read_text(errors="replace")

    def wait_for(self, what, found, timeout=START_SECONDS):
        """Polls C{found()} until it gives something other than None; fails naming C{what} if the daemon
        exits or C{timeout} seconds pass first."""
        def found_while_running():
            if self.process.poll() is not None:
                raise AssertionError(f"the {self.name} exited ({self.process.returncode}) before {what}:\n"
                                     + self.log()[-3000:])
            return found()

        try:
            return poll_until(found_while_running, timeout, what, interval=0.2)
        except AssertionError as problem:
            if self.process.poll() is not None:
                raise
            raise AssertionError(f"{problem}; the {self.name} log ends:\n" + self.log()[-3000:]) from None

    def wait_for_line(self, pattern):
        """The first match of C{pattern} in the log, once there."""
        return self.wait_for(f"line like {pattern.pattern!r}", lambda: pattern.search(self.log()))

    def stop(self):
        """Stops the daemon's process group: SIGTERM, then SIGKILL if it is still there after 20 s."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


def alive_workers(web_ui_port):
    """The master's count of live workers, from its web UI's JSON."""
    with urllib.request.urlopen(f"http://127.0.0.1:{web_ui_port}/json/", timeout=5) as answer:
        return json.load(answer)["aliveworkers"]


@dataclass
class Cluster:
    """A standalone cluster's daemons, its master URL and the worker's directory for its executors."""

    master: SparkDaemon
    worker: SparkDaemon
    url: str
    work_dir: pathlib.Path


@pytest.fixture(scope="module")
def cluster_started(tmp_path_factory):
    """A master and a worker, started but perhaps not ready yet; stopped at the end of the module."""
    tmp = tmp_path_factory.mktemp("spark-cluster")
    daemons = []
    try:
        master = SparkDaemon("master", "master.Master", ["--host", "127.0.0.1", "--port", "0", "--webui-port", "0"],
                             tmp)
        daemons.append(master)
        url = master.wait_for_line(MASTER_URL).group(1)
        worker = SparkDaemon("worker", "worker.Worker", [
            "--host", "127.0.0.1", "--port", "0", "--webui-port", "0", "--cores", "2", "--memory", "2g",
            "--work-dir", str(tmp / "work"), url], tmp)
        daemons.append(worker)
        yield Cluster(master, worker, url, tmp / "work")
    finally:
        for daemon in reversed(daemons):
            daemon.stop()


@pytest.fixture(scope="module")
def cluster(cluster_started):
    """The cluster, once a worker has registered with its master."""
    port = cluster_started.master.wait_for_line(WEB_UI_PORT).group(1)
    cluster_started.master.wait_for("a registered worker", lambda: alive_workers(port) or None)
    return cluster_started


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Synthetic runs of every label, the one of L{LOST_IN} missing a confirmed message."""
    out = tmp_path_factory.mktemp("runs")
    for label in LABELS:
        run = SyntheticRun(label)
        if label == LOST_IN:
            run.plant_lost_message()
        run.write(out / "runs" / label)
    return out


@dataclass
class Validation:
    """The one command running as a child process over a copy of some runs, with only its Spark job."""

    process: subprocess.Popen
    out: pathlib.Path

    @classmethod
    def start(cls, runs, out, *arguments, environment):
        shutil.copytree(runs / "runs", out / "runs")
        with open(out / "stdout", "wb") as stdout, open(out / "stderr", "wb") as stderr:
            process = subprocess.Popen(
                [sys.executable, "-m", "spark_jobs.validate_backends", "--backends", ",".join(LABELS),
                 "--out", str(out), "--reuse-runs", "--keep-exports", *arguments],
                cwd=ROOT, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr, env=environment)
        return cls(process, out)

    def output(self, name):
        return (self.out / name).read_text(errors="replace")

    def finish(self):
        """Waits for the command: its exit status, standard output and summary."""
        status = self.process.wait(timeout=JOB_SECONDS)
        assert status in (0, 1), self.output("stdout") + self.output("stderr")
        with open(self.out / "summary.json", encoding="utf-8") as summary:
            return status, self.output("stdout"), json.load(summary)

    def kill(self):
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


@pytest.fixture(scope="module")
def local_job(runs, tmp_path_factory):
    """The job in local mode, started before the cluster and left running beside it (2 cores, both busy)."""
    job = Validation.start(runs, tmp_path_factory.mktemp("local"), "--driver-memory", "1g",
                           environment=spark_environment())
    yield job
    job.kill()


@pytest.fixture(scope="module")
def cluster_summary(local_job, cluster, runs, tmp_path_factory):
    """The job on the cluster, its executor JVM started with L{QUICK_JVM} as the driver's is."""
    environment = spark_environment()
    environment["PYSPARK_SUBMIT_ARGS"] = (f"--conf spark.executor.extraJavaOptions={QUICK_JVM} "
                                          + environment["PYSPARK_SUBMIT_ARGS"])
    job = Validation.start(runs, tmp_path_factory.mktemp("cluster"), "--master", cluster.url, "--driver-memory",
                           "1g", environment=environment)
    try:
        return job.finish()
    finally:
        job.kill()


@pytest.fixture(scope="module")
def local_summary(local_job, cluster_summary):
    return local_job.finish()


def comparable(summary):
    """A summary without what differs from one run of the job to the next (its wall times)."""
    return {key: value for key, value in summary.items() if key != "timings"}


def test_the_job_on_a_standalone_cluster_finds_what_local_mode_finds(cluster_summary, local_summary):
    (cluster_status, cluster_output, on_cluster), (local_status, _, local) = cluster_summary, local_summary
    assert cluster_status == local_status == 1, "a check failed"
    assert on_cluster["verdict"] == local["verdict"] == "fail"
    lost = on_cluster["backends"][LOST_IN]["checks"]["confirmed_delivered_or_stored"]
    assert (lost["pass"], lost["violations"]) == (False, 1), lost
    for label in LABELS:
        assert on_cluster["backends"][label]["run"] == local["backends"][label]["run"], label
        assert on_cluster["backends"][label]["checks"] == local["backends"][label]["checks"], label
    assert on_cluster["cross_backend"] == local["cross_backend"]
    assert comparable(on_cluster) == comparable(local)
    assert "verdict: fail" in cluster_output


def test_the_work_ran_on_the_clusters_executor_which_reached_the_driver_on_loopback(cluster, cluster_summary):
    master_log, worker_log = cluster.master.log(), cluster.worker.log()
    assert "Registered app brokerd-validate-backends with ID" in master_log, master_log[-2000:]
    launch = re.search(r"Asked to launch executor (\S+) for brokerd-validate-backends", worker_log)
    assert launch, worker_log[-2000:]
    assert '"--driver-url" "spark://CoarseGrainedScheduler@127.0.0.1:' in worker_log, worker_log[-2000:]
    executor_log = (cluster.work_dir / launch.group(1) / "stderr").read_text(errors="replace")
    assert re.search(r"Executor: Finished task .* in stage", executor_log), executor_log[-2000:]
