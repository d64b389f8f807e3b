"""The command examples of the manual: every ``.. code-block:: console`` block
of docs/*.rst, each ``$ `` line a command (a line ending with a backslash goes
on with the next) and the lines after it, up to the next command, what it
prints."""

import pathlib
import re
import shlex
from typing import NamedTuple

from tests.support.paths import ROOT

DOCS = ROOT / "docs"
CONSOLE_BLOCK = re.compile(r"^\.\. code-block:: console\n((?:\n|   .*\n)+)", re.M)


class DocCommand(NamedTuple):
    """One command example: its page, its text as shown (continuations joined) and what it shows it printing."""

    page: str
    text: str
    output: tuple

    @property
    def words(self):
        return shlex.split(self.text)


def console_commands(path):
    """The commands of one page's console blocks, in the page's order."""
    found = []
    for block in CONSOLE_BLOCK.finditer(pathlib.Path(path).read_text()):
        command, output = None, []
        for line in [line[3:] for line in block.group(1).splitlines() if line.strip()]:
            if line.startswith("$ ") and not (command is not None and command.endswith("\\")):
                if command is not None:
                    found.append(DocCommand(path.name, command, tuple(output)))
                command, output = line[2:], []
            elif command is not None and command.endswith("\\"):
                command = command[:-1].rstrip() + " " + line.strip()
            else:
                output.append(line)
        if command is not None:
            found.append(DocCommand(path.name, command, tuple(output)))
    return found


def pages():
    """The manual's pages that show commands."""
    return sorted(path for path in DOCS.glob("*.rst") if console_commands(path))
