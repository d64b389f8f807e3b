"""The dashboard: its page at C{/} and its files under C{/static/}, shipped in C{brokerd/http/static}.

The files are plain HTML, CSS and JavaScript modules served as they are (no
build step, nothing fetched from elsewhere, so the page works on a broker
without internet). They hold no data and need no login: the page asks
C{/api/} for everything with the credentials its user typed, so the API's
basic authentication and tag rules apply to it as to any other client.
"""

import os

from twisted.web import resource, static

STATIC_DIRECTORY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "static")
INDEX_FILE = os.path.join(STATIC_DIRECTORY, "index.html")

# Fixed types rather than the host's mime.types: browsers run modules only when served as JavaScript.
CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".png": "image/png",
    ".svg": "image/svg+xml",
}
# The page runs only its own scripts and talks only to its own origin; cached copies are checked
# with the broker (Last-Modified) so that an upgraded broker serves its new files at once.
HEADERS = {
    b"content-security-policy": b"default-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
    b"x-content-type-options": b"nosniff",
    b"referrer-policy": b"no-referrer",
    b"cache-control": b"no-cache",
}


class DashboardFiles(static.File):
    """
    The dashboard's files as C{static.File} serves them (a path segment that
    would leave the directory, such as C{..}, is not found), with fixed
    content types and the headers above, and no directory listings.
    """

    contentTypes = CONTENT_TYPES

    def __init__(self, path, defaultType="application/octet-stream", ignoredExts=(), registry=None):
        super().__init__(path, defaultType, ignoredExts, registry)
        self.indexNames = []  # the page is at /, not /static/

    def directoryListing(self):
        return resource.NoResource()

    def render(self, request):
        for name, value in HEADERS.items():
            request.setHeader(name, value)
        return super().render(request)


def add_dashboard(root):
    """Put the dashboard's page at C{/} and its files at C{/static/} of the twisted.web resource C{root}."""
    root.putChild(b"", DashboardFiles(INDEX_FILE))
    root.putChild(b"static", DashboardFiles(STATIC_DIRECTORY))
