"""
The API reference: pydoctor run over brokerd's packages as part of the Sphinx
build, its HTML written to C{api/} of the HTML output.

Twisted builds its API reference the same way (pydoctor's own
C{pydoctor.sphinx_ext.build_apidocs}); this one runs pydoctor in a process of
its own, while Sphinx reads the pages (in Sphinx's process, pydoctor's
reStructuredText directives would replace Sphinx's), and tells its warnings
apart. Every warning pydoctor prints (a docstring that is not valid
epytext, an C{L{}} link that does not resolve) becomes a Sphinx warning naming
the file and line, so C{sphinx -W} fails on it.
"""

import pathlib
import re
import subprocess
import sys

from sphinx.util import logging

logger = logging.getLogger(__name__)

WARNING_LINE = re.compile(r"^(?P<path>/[^:]+):(?P<line>\d+): (?P<message>.*)$")
# pydoctor closes with a summary of the objects whose docstrings did not parse
# ("these 2 objects' docstrings contain syntax errors:" and one indented name
# a line); each of those errors was already printed with its file and line.
SUMMARY_LINE = re.compile(r"^(these \d+ objects' docstrings contain syntax errors:|this object's docstring"
                          r" contains syntax errors:|    \S+)$")


def pydoctor_arguments(packages, root, output):
    """The pydoctor command line that writes the API reference of C{packages} (under C{root}) to C{output}."""
    return ["--make-html", "--quiet", "--docformat=epytext", "--project-name=brokerd",
            f"--project-base-dir={root}", f"--html-output={output}", "--no-sidebar",
            *[str(pathlib.Path(root) / package) for package in packages]]


def warnings_of(text, root):
    """
    pydoctor's output as a list of C{(path, line, message)}, C{path} relative to
    C{root} (None and 0 for a line that names no file).
    """
    failing = []
    for line in text.splitlines():
        match = WARNING_LINE.match(line)
        if match is None:
            if line.strip() and not SUMMARY_LINE.match(line):
                failing.append((None, 0, line))
            continue
        path = pathlib.Path(match["path"])
        try:
            shown = path.relative_to(root).as_posix()
        except ValueError:
            shown = path.as_posix()
        failing.append((shown, int(match["line"]), match["message"]))
    return failing


def start_api_reference(app):
    """Start pydoctor writing into C{<outdir>/api} (C{builder-inited})."""
    if app.builder.name != "html":
        return
    root = pathlib.Path(app.config.api_reference_root)
    output = pathlib.Path(app.outdir) / "api"
    arguments = pydoctor_arguments(app.config.api_reference_packages, root, output)
    logger.info("building the API reference: pydoctor " + " ".join(arguments))
    app.api_reference_run = subprocess.Popen([sys.executable, "-m", "pydoctor", *arguments], cwd=root,
                                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def report_api_reference(app, env):
    """Wait for pydoctor and report its warnings (C{env-updated}: the pages are read, none written yet)."""
    run = getattr(app, "api_reference_run", None)
    if run is None:
        return
    app.api_reference_run = None
    printed, _ = run.communicate()
    root = pathlib.Path(app.config.api_reference_root)
    for path, line, message in warnings_of(printed, root):
        logger.warning(f"pydoctor: {message}", location=f"{path}:{line}" if path else None)
    if run.returncode not in (0, 2):  # 2: docstrings with syntax errors, each reported above with its file
        logger.warning(f"pydoctor exited with status {run.returncode}")


def setup(app):
    app.add_config_value("api_reference_packages", [], "env")
    app.add_config_value("api_reference_root", ".", "env")
    app.connect("builder-inited", start_api_reference)
    app.connect("env-updated", report_api_reference)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
