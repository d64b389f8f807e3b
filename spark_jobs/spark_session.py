"""The Spark session the validation's Spark job runs in (L{spark_jobs.analysis}).

L{create_session} starts Spark in local mode by default (C{local[*]}, web UI
off, a few shuffle partitions per core, driver memory half of this machine's
RAM, fixed when the JVM starts); a C{master} URL runs the same job on a
cluster. There the executors read the run directories and write the staged
tables under C{<out>/spark-work/} themselves, by the driver's paths: on
more than one machine C{<out>} must be on a file system every node mounts at
the same path. Under C{spark-submit} the JVM is already running: its own
C{--master} and C{--driver-memory} flags apply.
"""

import ipaddress
import os
import sys

from pyspark.sql import SparkSession

APP_NAME = "brokerd-validate-backends"
DEFAULT_MASTER = "local[*]"


def default_driver_memory():
    """Half of this machine's RAM (at least 1 GiB), as a Spark memory string: room for the
    shuffles and caches of a million-message run, and for the OS's page cache."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return "4g"
    return f"{max(1024, total // 2 // (1 << 20))}m"


def create_session(master=None, driver_memory=None, app_name=APP_NAME):
    """
    A Spark session for the job.

    @param master: a Spark master URL; None for C{local[*]}, or for the master
        C{spark-submit} chose when it launched this program.
    @param driver_memory: e.g. C{"12g"}; None for L{default_driver_memory} in
        local mode. It only applies to a JVM started here.
    """
    launched_by_submit = "PYSPARK_GATEWAY_PORT" in os.environ
    if master is None and not launched_by_submit:
        master = DEFAULT_MASTER
    builder = (SparkSession.builder.appName(app_name)
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.log.level", "WARN"))
    if master is not None:
        builder = builder.master(master)
    if master is not None and master.startswith("local"):
        # A few partitions per core (adaptive execution merges small ones), and
        # a loopback driver: no hostname lookups on a laptop or CI box.
        partitions = max(4, 4 * (os.cpu_count() or 1))
        builder = (builder.config("spark.sql.shuffle.partitions", str(partitions))
                   .config("spark.driver.host", "127.0.0.1")
                   .config("spark.driver.bindAddress", "127.0.0.1"))
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        if not launched_by_submit:
            builder = builder.config("spark.driver.memory",
                                     driver_memory or default_driver_memory())
    elif master is not None:
        # The executors run a few Python tasks (the small tables made on the driver, like the
        # runs' last epochs); unless told otherwise they start this interpreter, which has
        # pyspark and the driver's Python version: the same path on every node, as here.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        if master_on_loopback(master):
            # Its workers are on this machine: the driver listens on loopback too, for them alone.
            builder = (builder.config("spark.driver.host", "127.0.0.1")
                       .config("spark.driver.bindAddress", "127.0.0.1"))
        if driver_memory is not None and not launched_by_submit:
            builder = builder.config("spark.driver.memory", driver_memory)
    return builder.getOrCreate()


def master_on_loopback(master):
    """Whether every host of a standalone master URL (C{spark://h1:7077,h2:7077}) is a loopback
    address."""
    if not master.startswith("spark://"):
        return False
    addresses = master[len("spark://"):].split(",")
    hosts = [address.rpartition(":")[0] or address for address in addresses]
    return all(_is_loopback(host) for host in hosts)


def _is_loopback(host):
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
