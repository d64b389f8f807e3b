"""Where the checkout is, for tests that run its programs or read its files."""

import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]  # tests/support/paths.py -> the checkout
