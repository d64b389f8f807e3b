"""brokerd-admin's command line itself, without a broker: --help lists every command once under its
task, each command has its own --help, a command line that does not parse is status 2, no command's
argument can stand in for the login's, the deprecated commands' messages name commands it has, and
it imports brokerd.migrate (with Twisted and the backends) only to migrate."""

import argparse
import re
import subprocess
import sys

import pytest

from brokerd.admin import cli, migration
from brokerd.migrate import cli as migrate_cli
from brokerd.native.admincli import REPLACEMENTS
from tests.support.paths import ROOT

GLOBAL_DESTS = {"url", "user", "password", "format", "command", "help"}


def subparsers(parser):
    action, = [action for action in parser._actions if isinstance(action, argparse._SubParsersAction)]
    return action.choices


def test_help_lists_every_command_once_under_its_task():
    done = subprocess.run([sys.executable, "-m", "brokerd.admin", "--help"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert (done.returncode, done.stderr) == (0, "")
    listing = done.stdout.split("commands, by task")[1]
    tasks = [line.strip() for line in listing.splitlines() if line.startswith("  ") and not line.startswith("    ")]
    assert tasks == [task for task, _ in cli.TASKS]
    listed = [line.split()[0] for line in listing.splitlines() if line.startswith("    ")]
    assert listed == list(cli.COMMANDS)
    assert set(listed) >= {"list", "add-user", "delete-user", "change-password", "set-user-tags", "add-vhost",
                           "delete-vhost", "set-permissions", "clear-permissions", "set-policy", "clear-policy",
                           "export", "import", "purge", "close-connection", "migrate"}


@pytest.mark.parametrize("name", list(cli.COMMANDS))
def test_each_command_has_its_own_help(name, capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main([name, "--help"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: brokerd-admin {name} ")


@pytest.mark.parametrize("argv", [[], ["nosuch"], ["add-user", "alice"], ["list", "nothing"],
                                  ["set-policy", "--priority", "high", "p", ".*", "{}"], ["migrate", "--from", "x"]])
def test_a_command_line_that_does_not_parse_is_status_2(argv, capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main(argv)
    assert exited.value.code == 2
    assert "brokerd-admin" in capsys.readouterr().err


@pytest.mark.parametrize("name", list(cli.COMMANDS))
def test_no_argument_of_a_command_takes_the_place_of_a_global_option(name):
    """A positional named like --user or --password would replace the login's (the sub-parser writes last)."""
    command_parser = subparsers(cli.build_parser())[name]
    assert not {action.dest for action in command_parser._actions} & GLOBAL_DESTS - {"help"}


@pytest.mark.parametrize("command", sorted(REPLACEMENTS))
def test_each_deprecated_native_command_names_a_brokerd_admin_command_line(command):
    words = re.sub(r"\[[^]]*\]", "", REPLACEMENTS[command]).split()  # the optional parts left out
    words = [word if not word.isupper() else "x" for word in words]
    cli.build_parser().parse_args(words)  # exits with status 2 if brokerd-admin has no such command line


def options(add_arguments):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return sorted((tuple(action.option_strings), action.dest, action.required, action.default, type(action).__name__)
                  for action in parser._actions if action.dest != "help")


def test_migrate_takes_the_options_of_brokerd_migrate():
    assert options(migration.add_arguments) == options(migrate_cli.add_arguments)


def test_only_migrate_imports_brokerd_migrate_and_twisted():
    script = ("import sys; from brokerd.admin import cli; cli.build_parser().parse_args(['list', 'queues']);"
              " print(sorted(name for name in sys.modules if name.startswith(('brokerd.migrate', 'twisted',"
              " 'backends'))))")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (0, "[]\n", "")
