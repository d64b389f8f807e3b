"""C{brokerd-admin}: an operator's command line over the HTTP management API.

It is a client of the API only (L{brokerd.admin.client} over C{urllib}) and imports
nothing of the broker itself, so it runs wherever the API is reachable.
"""
