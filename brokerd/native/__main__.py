"""Entry point of ``python -m brokerd.native`` (see L{brokerd.native.cli})."""

from brokerd.native.cli import main

main()
