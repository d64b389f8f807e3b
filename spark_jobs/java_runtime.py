"""Whether Spark's JVM can start here: a Java runtime new enough for the pyspark installed.

pyspark starts its JVM through C{$JAVA_HOME/bin/java}, else the C{java} on
C{PATH}; without one it fails deep in its gateway (C{JAVA_GATEWAY_EXITED}),
after the workload has run. L{java_problem} finds that out first, in the time
C{java -version} takes, and L{missing_java_line} is the one line the
validation prints then; L{is_gateway_failure} recognises the gateway's own
failure, for a runtime that passed the check and still could not start.
"""

import importlib.metadata
import os
import re
import shutil
import subprocess

# Debian's and Ubuntu's package of the runtime: the smallest one that runs Spark.
DEBIAN_PACKAGE = "openjdk-17-jre-headless"
VERSION_SECONDS = 30
_VERSION = re.compile(r'version "(\d+)(?:\.(\d+))?')


def minimum_java():
    """The oldest Java the installed pyspark runs on: 17 for pyspark 4, 8 before."""
    try:
        major = int(importlib.metadata.version("pyspark").split(".")[0])
    except (importlib.metadata.PackageNotFoundError, ValueError):
        major = 4
    return 17 if major >= 4 else 8


def java_command(environ=None):
    """
    The java pyspark's launcher would run (C{$JAVA_HOME/bin/java} when
    C{JAVA_HOME} is set, else C{java} from C{PATH}), and None when there is none.
    """
    environ = os.environ if environ is None else environ
    home = environ.get("JAVA_HOME")
    if home:
        path = os.path.join(home, "bin", "java")
        return path if os.access(path, os.X_OK) else None
    return shutil.which("java", path=environ.get("PATH", os.defpath))


def java_major_version(command):
    """The major version C{command -version} reports (C{1.8} is 8), or None if it says none."""
    try:
        answer = subprocess.run([command, "-version"], capture_output=True, text=True,
                                timeout=VERSION_SECONDS, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    match = _VERSION.search(answer.stderr + answer.stdout)
    if match is None:
        return None
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major


def java_problem(environ=None):
    """
    Why Spark's JVM cannot start here, or None when it can (or when
    C{spark-submit} already started it, or the version cannot be read: the
    gateway then has the last word).
    """
    environ = os.environ if environ is None else environ
    if "PYSPARK_GATEWAY_PORT" in environ:
        return None
    command = java_command(environ)
    if command is None:
        if environ.get("JAVA_HOME"):
            return f"JAVA_HOME is {environ['JAVA_HOME']!r}, which has no bin/java"
        return "no java on PATH and JAVA_HOME is not set"
    major = java_major_version(command)
    if major is not None and major < minimum_java():
        return f"{command} is Java {major}"
    return None


def missing_java_line(problem):
    """The one line saying that Java is needed, why it was not found, and how to get it."""
    return (
        f"the Spark job needs Java {minimum_java()} or later: {problem}; install it"
        f" (Debian, Ubuntu: apt-get install {DEBIAN_PACKAGE}) or set JAVA_HOME to one"
    )


def is_gateway_failure(error):
    """True if C{error} is pyspark's failure to start its JVM (C{JAVA_GATEWAY_EXITED})."""
    get_class = getattr(error, "getErrorClass", None)
    return callable(get_class) and get_class() == "JAVA_GATEWAY_EXITED"
