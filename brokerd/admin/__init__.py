"""C{brokerd-admin}: the operator's command line, over the HTTP management API.

It is a client of the API only (L{brokerd.admin.client} over C{urllib}) and
imports nothing of the broker itself, so it runs wherever the API is
reachable; the one exception is C{brokerd-admin migrate}, which works on a
stopped broker's files and imports L{brokerd.migrate} when it runs.
L{brokerd.admin.cli} holds the command line, L{brokerd.admin.tables} the
table printer, and L{brokerd.admin.listing}, L{brokerd.admin.access},
L{brokerd.admin.operations} and L{brokerd.admin.migration} the commands.
"""
