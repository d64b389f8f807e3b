"""How the tests start Spark's driver JVM: with the C1 JIT compiler alone.

A driver JVM that lives for one short job over a few thousand events spends
about as much CPU in the C2 compiler, optimising code it will hardly run again,
as in the job itself; C{-XX:TieredStopAtLevel=1} stops at C1 and the same job
takes about half the CPU (the results do not depend on the compiler). PySpark
passes C{PYSPARK_SUBMIT_ARGS} to the C{spark-submit} that launches the driver,
in this process (L{spark_session}) or in a child (L{spark_environment}); a
C{PYSPARK_SUBMIT_ARGS} already set is left as it is.
"""

import os

import pytest

from spark_jobs.spark_session import create_session

SUBMIT_ARGS = "--driver-java-options -XX:TieredStopAtLevel=1 pyspark-shell"


def spark_environment():
    """This process's environment for a child that starts Spark."""
    return {"PYSPARK_SUBMIT_ARGS": SUBMIT_ARGS, **os.environ}


def spark_session(**options):
    """L{create_session} with C{options}, its driver launched with L{SUBMIT_ARGS}."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PYSPARK_SUBMIT_ARGS", os.environ.get("PYSPARK_SUBMIT_ARGS", SUBMIT_ARGS))
        return create_session(**options)
