"""The README's quick start is exactly two commands, and CI runs the test one."""

import pathlib
import re

from tests.support.paths import ROOT


def quick_start_commands():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    return [block.strip() for block in re.findall(r"```sh\n(.*?)```", section, re.S)]


def test_quick_start_has_a_run_command_and_a_test_command():
    run, test = quick_start_commands()
    assert "twistd -n brokerd" in run
    assert "pytest" in test


def test_ci_runs_the_readme_test_command():
    _, test = quick_start_commands()
    ci_script = (ROOT / ".ci" / "run").read_text().strip().splitlines()
    assert ci_script[-1] == test
