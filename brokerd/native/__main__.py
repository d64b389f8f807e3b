"""Entry point of ``python -m brokerd.native``, the same command line as ``brokerd-native``
(see L{brokerd.native.cli})."""

from brokerd.native.cli import main

main(prog="python -m brokerd.native")
