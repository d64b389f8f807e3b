"""Installs brokerd: the broker, its storage backends and the twistd plugin."""

import re

from setuptools import find_packages, setup
from setuptools.command.editable_wheel import editable_wheel


class EditableWithTwistedPlugins(editable_wheel):
    """Editable installs default to setuptools' "compat" mode (the project root on
    sys.path), the only mode in which twistd's plugin scan sees
    twisted/plugins/brokerd_plugin.py; an explicit --config-settings
    editable_mode=... still wins."""

    def initialize_options(self):
        super().initialize_options()
        self.mode = "compat"

PROTOBUF_RUNTIME = "protobuf>=7.35.1,<8"  # generated code is from grpcio-tools 1.85.1 (gencode 7.35.1)

# The AMQP clients users already have; the interop tests drive the broker with each.
AMQP_CLIENTS = ["pika>=1.3", "kombu>=5.3", "celery>=5.3", "aio-pika>=9"]
# The cross-backend validation job: Spark for the analysis, matplotlib for the
# report's PNG charts.
SPARK_REQUIREMENTS = ["pyspark>=3.5", "matplotlib>=3.8"]
# The manual (Sphinx) and the API reference (pydoctor), built by
# python -m sphinx -W --keep-going -b html docs docs/_build/html; the tests build them too.
DOCS_REQUIREMENTS = ["sphinx>=9.0", "pydoctor>=25.10"]
# pytest-xdist runs the suite on every core: most tests wait on real broker
# processes, so two workers take the suite well under its ten-minute budget.
# Selenium drives a real headless Chromium (Debian's chromium and chromium-driver) through the dashboard.
TEST_REQUIREMENTS = ["pytest>=8", "pytest-xdist>=3.5", "trustme>=1.1", "grpcio-tools==1.85.1", "selenium>=4.10",
                     *AMQP_CLIENTS, *SPARK_REQUIREMENTS, *DOCS_REQUIREMENTS]

setup(
    name="brokerd",
    version=re.search(r'__version__ = "([^"]+)"', open("brokerd/__init__.py", encoding="utf-8").read()).group(1),
    description="An AMQP 0-9-1 model message broker on Twisted with pluggable on-disk stores",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.11",
    cmdclass={"editable_wheel": EditableWithTwistedPlugins},
    # twisted/plugins has no __init__.py on purpose: Twisted owns that package and
    # finds drop-ins by path, so only our module is shipped into it.
    packages=find_packages(include=["brokerd", "brokerd.*", "backends", "backends.*", "spark_jobs", "spark_jobs.*"])
    + ["twisted.plugins"],
    # brokerd/http/static: the dashboard's page, styles and scripts, served as they are.
    package_data={"twisted": ["plugins/brokerd_plugin.py"], "brokerd.proto": ["*.proto"],
                  "brokerd.http": ["static/*"]},
    install_requires=[
        "twisted[tls]>=24.7",  # pyOpenSSL and service_identity, for the ssl: listeners (--amqps)
        PROTOBUF_RUNTIME,
        "zope.interface>=6",
        "pamqp>=3.3",
        "prometheus_client>=0.17",  # --prometheus: the metrics' exposition format, and its parser in the tests
        # ISA-L's CRC-32 for the stores' record checksums, where it has wheels (a fallback to
        # zlib's otherwise): 64 KiB persistent publishing 14-16% faster.
        "isal>=1.6; platform_machine == 'x86_64' or platform_machine == 'AMD64'"
        " or platform_machine == 'aarch64' or platform_machine == 'arm64'",
    ],
    extras_require={
        "test": TEST_REQUIREMENTS,
        "spark": ["pika>=1.3", *SPARK_REQUIREMENTS],
        "docs": DOCS_REQUIREMENTS,
        "all": TEST_REQUIREMENTS,
    },
    entry_points={
        # Storage backends, looked up by name for --backend; a new backend is a new
        # package under backends/ plus one line here.
        "brokerd.backends": [
            "memory = backends.memory:backend",
            "sqlite = backends.sqlite:backend",
            "filelog = backends.filelog:backend",
            "chunked = backends.chunked:backend",
        ],
        # Every command a user runs, each with --help (twistd brokerd runs the broker itself).
        # brokerd-admin: the operator's commands over the HTTP management API, and offline migration.
        # brokerd-native: the native client's command line (also python -m brokerd.native).
        # The cross-backend validation (the spark extra): brokerd-validate runs all of it; its steps,
        # run by hand, are programs of their own, each with its own options and exit statuses
        # (python -m spark_jobs.workload, .export and .report run the same).
        "console_scripts": [
            "brokerd-admin = brokerd.admin.cli:main",
            "brokerd-native = brokerd.native.cli:main",
            "brokerd-validate = spark_jobs.validate_backends:main",
            "brokerd-workload = spark_jobs.workload:main",
            "brokerd-store-export = spark_jobs.export:main",
            "brokerd-report = spark_jobs.report:main",
        ],
    },
)
