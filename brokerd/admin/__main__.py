"""C{python -m brokerd.admin}: the same as the C{brokerd-admin} console script."""

import sys

from brokerd.admin.cli import main

sys.exit(main())
