"""Sphinx configuration of brokerd's manual and API reference.

Build both with one command, from the repository root::

    python -m sphinx -W --keep-going -b html docs docs/_build/html

The manual is the reStructuredText pages here; the API reference (pydoctor,
from the epytext docstrings of brokerd, backends and spark_jobs) is written
into the same output under ``api/`` by ``_ext/api_reference.py``, and the
option reference is generated from the code by ``_ext/option_reference.py``.
"""

import pathlib
import sys

DOCS = pathlib.Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path[:0] = [str(DOCS / "_ext"), str(ROOT)]

from brokerd import __version__  # noqa: E402  (the path above makes brokerd importable from a checkout)

project = "brokerd"
author = "brokerd's authors"
copyright = "brokerd's authors"
version = release = __version__

extensions = ["option_reference", "api_reference"]
exclude_patterns = ["_build", "_ext"]
templates_path = []
html_theme = "alabaster"
html_static_path = ["_static"]
html_css_files = ["brokerd.css"]
html_title = f"brokerd {__version__}"
html_theme_options = {"description": "An AMQP 0-9-1 message broker on Twisted", "fixed_sidebar": True,
                      "page_width": "1240px", "body_max_width": "none"}
highlight_language = "none"
smartquotes = False  # option names keep their two hyphens, quotes stay straight

# The API reference: pydoctor over the shipped packages, into <output>/api/.
api_reference_packages = ["brokerd", "backends", "spark_jobs"]
api_reference_root = str(ROOT)
