"""The validation on a machine without the Java runtime Spark needs: one line saying so, and exit status 4.

The command is run as a user runs it (``brokerd-validate``), with ``JAVA_HOME`` naming a directory that does
not exist, or with no ``java`` on ``PATH``: it must say in one line that Java 17 or later is needed and how to
get it, before any workload starts (so within seconds, and writing nothing). A runtime that passes that check
but cannot start Spark's JVM (here a ``bin/java`` that exits at once) is caught when the Spark job starts, after
the runs, with the same line and status rather than pyspark's JAVA_GATEWAY_EXITED traceback.
"""

import os
import pathlib
import subprocess
import sys
import time

import pytest

NO_JAVA = 4
FAST_SECONDS = 20
HINT = "; install it (Debian, Ubuntu: apt-get install openjdk-17-jre-headless) or set JAVA_HOME to one\n"
VALIDATE = str(pathlib.Path(sys.executable).parent / "brokerd-validate")


def validate(tmp_path, env, *args):
    command = [VALIDATE, "--backends", "sqlite", "--messages", "10", "--out", str(tmp_path / "out"), *args]
    return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


def without(name):
    return {key: value for key, value in os.environ.items() if key != name}


def test_java_home_naming_no_directory_is_one_line_and_status_4_before_any_run(tmp_path):
    missing = tmp_path / "no-such-jdk"
    started = time.monotonic()
    result = validate(tmp_path, {**os.environ, "JAVA_HOME": str(missing)})
    assert time.monotonic() - started < FAST_SECONDS
    assert (result.returncode, result.stdout) == (NO_JAVA, "")
    assert result.stderr == (f"the Spark job needs Java 17 or later: JAVA_HOME is {str(missing)!r},"
                             " which has no bin/java" + HINT)
    assert not (tmp_path / "out").exists()


def test_no_java_on_path_is_one_line_and_status_4(tmp_path):
    empty = tmp_path / "bin"
    empty.mkdir()
    result = validate(tmp_path, {**without("JAVA_HOME"), "PATH": str(empty)})
    assert (result.returncode, result.stdout) == (NO_JAVA, "")
    assert result.stderr == "the Spark job needs Java 17 or later: no java on PATH and JAVA_HOME is not set" + HINT


@pytest.mark.skipif(not os.access("/bin/false", os.X_OK), reason="needs /bin/false")
def test_a_java_that_cannot_start_the_jvm_is_caught_when_the_spark_job_starts(tmp_path):
    broken = tmp_path / "broken-jdk"
    (broken / "bin").mkdir(parents=True)
    (broken / "bin" / "java").symlink_to("/bin/false")  # says no version, and starts nothing
    result = validate(tmp_path, {**os.environ, "JAVA_HOME": str(broken)}, "--quiet")
    assert result.returncode == NO_JAVA, result.stderr
    assert "Traceback" not in result.stderr and "JAVA_GATEWAY_EXITED" not in result.stderr
    assert result.stderr == (f"the Spark job needs Java 17 or later: {broken / 'bin' / 'java'} did not start Spark's"
                             " JVM (what it said is above, or in spark.log)" + HINT)


def test_help_names_status_4():
    shown = subprocess.run([VALIDATE, "--help"], capture_output=True, text=True, timeout=60).stdout
    assert "4 no Java runtime for Spark (Java 17+; Debian: openjdk-17-jre-headless)" in " ".join(shown.split())
