"""C{python -m brokerd.migrate}, kept for one release: it says on stderr that
C{brokerd-admin migrate} replaces it, then migrates as before
(L{brokerd.migrate.cli})."""

from brokerd.migrate.cli import main

main()
