"""The manual and the API reference build with the documented command, every
warning an error (Sphinx's, and pydoctor's: a docstring that is not valid
epytext, an L{} link that does not resolve), and the generated option reference
lists exactly what ``twistd brokerd --help`` and ``--help-backends`` list."""

import html
import os
import re
import subprocess
import sys

import pytest

from tests.support.paths import ROOT

pytestmark = pytest.mark.long_module(seconds=60)  # started early (tests/conftest.py)

BUILD_COMMAND = "python -m sphinx -W --keep-going -q -b html docs docs/_build/html"

@pytest.fixture(scope="module")
def build(tmp_path_factory):
    """Run the documented build command into a temporary directory; its CompletedProcess and output directory."""
    output = tmp_path_factory.mktemp("html")
    command = BUILD_COMMAND.split()
    command[0] = sys.executable
    command[-1] = str(output)
    command[-2:-2] = ["-E"]  # every page read afresh
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)))
    return result, output


def test_the_readme_and_the_manual_document_one_build_command():
    assert f"```sh\n{BUILD_COMMAND}\n```" in (ROOT / "README.md").read_text()
    assert f"   $ {BUILD_COMMAND}\n" in (ROOT / "docs" / "index.rst").read_text()


def test_the_build_has_no_warnings(build):
    result, output = build
    assert result.returncode == 0, result.stdout + result.stderr
    assert "WARNING" not in result.stderr, result.stderr
    assert (output / "index.html").exists()
    assert (output / "api" / "index.html").exists()
    assert (output / "api" / "brokerd.interfaces.IMessageStore.html").exists()


def test_the_api_reference_covers_the_shipped_packages(build):
    _, output = build
    for package in ("brokerd", "backends", "spark_jobs"):
        assert (output / "api" / f"{package}.html").exists(), package


def rendered_table_rows(page):
    """Each row of the generated option tables of a built page, as a list of its cells' text."""
    rows = []
    for row in re.findall(r"<tr[^>]*>(.*?)</tr>", page, re.S):
        cells = [html.unescape(re.sub(r"<[^>]+>", "", cell)).strip() for cell in re.findall(r"<td[^>]*>(.*?)</td>",
                                                                                            row, re.S)]
        if cells:
            rows.append(cells)
    return rows


def twistd(*args):
    return subprocess.run([os.path.join(os.path.dirname(sys.executable), "twistd"), *args], capture_output=True,
                          text=True, check=True).stdout


def test_the_option_reference_lists_exactly_the_options_of_twistd_brokerd_help(build):
    _, output = build
    rows = rendered_table_rows((output / "options.html").read_text())
    rendered = {row[0].rstrip("=") for row in rows if row[0].startswith("--")}
    listed = set(re.findall(r"^ {1,10}(?:-\w, )?(--[\w-]+)", twistd("brokerd", "--help"), re.M))
    assert rendered == listed


def test_the_option_reference_shows_each_default_as_help_does(build):
    _, output = build
    rows = [row for row in rendered_table_rows((output / "options.html").read_text()) if row[0].startswith("--")]
    help_text = "".join(twistd("brokerd", "--help").split())  # its columns wrap anywhere
    for option, default, _ in rows:
        if default:
            assert f"[default:{default}]" in help_text, option


def test_the_option_reference_lists_every_backend_option(build):
    _, output = build
    page = (output / "options.html").read_text()
    listed = {}
    backend = None
    for line in twistd("brokerd", "--help-backends").splitlines():
        if not line.startswith(" "):
            backend = line.split(":", 1)[0]
            listed[backend] = set()
        else:
            listed[backend].add(line.split("=", 1)[0].strip())
    for backend, options in listed.items():
        section = re.search(rf'<section id="backend-{backend}">(.*?)</section>', page, re.S)
        assert section is not None, backend
        rendered = {row[0].rstrip("=") for row in rendered_table_rows(section.group(1))}
        assert rendered == options, backend
