"""The dashboard: its page at C{/} and its files under C{/static/}, shipped in
C{brokerd/http/static}.

The files are plain HTML, CSS and JavaScript modules served as they are (no
build step, nothing fetched from elsewhere, so the page works on a broker
without internet). They hold no data and need no login: the page asks
C{/api/} for everything with the credentials its user typed, so the API's
basic authentication and tag rules apply to it as to any other client.
Only the files the directory holds at start are served, each by its name: no
other path (C{..}, an encoded C{/}, a sub-directory) reaches the file system.
"""

import os

from twisted.web import http, pages, resource

STATIC_DIRECTORY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "static")
INDEX_NAME = "index.html"

# Fixed types rather than the host's mime.types: browsers run modules only when
# served as JavaScript.
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


class DashboardFile(resource.Resource):
    """
    One file of the dashboard, read when asked (they are a few kilobytes), with
    its type and the headers above.
    """

    isLeaf = True

    def __init__(self, path, content_type):
        super().__init__()
        self.path = path
        self.content_type = content_type.encode("ascii")

    def render_GET(self, request):
        if request.postpath:  # a path below a file
            return pages.notFound().render(request)
        with open(self.path, "rb") as file:
            modified = os.fstat(file.fileno()).st_mtime
            body = file.read()
        for name, value in HEADERS.items():
            request.setHeader(name, value)
        request.setHeader(b"content-type", self.content_type)
        if request.setLastModified(modified) is http.CACHED:
            return b""
        return body


class DashboardFiles(resource.Resource):
    """
    The files of a directory by name, those of the types above only; anything
    else is not found.
    """

    def __init__(self, directory):
        super().__init__()
        for name in sorted(os.listdir(directory)):
            path = os.path.join(directory, name)
            content_type = CONTENT_TYPES.get(os.path.splitext(name)[1])
            if content_type and os.path.isfile(path):
                self.putChild(name.encode("utf-8"), DashboardFile(path, content_type))

    def getChild(self, name, request):
        return pages.notFound()

    def render_GET(self, request):  # the directory itself: nothing to list
        return pages.notFound().render(request)


def add_dashboard(root, directory=STATIC_DIRECTORY):
    """
    Put the dashboard's page at C{/} and its files at C{/static/} of the
    twisted.web resource C{root}.
    """
    root.putChild(b"", DashboardFile(os.path.join(directory, INDEX_NAME), CONTENT_TYPES[".html"]))
    root.putChild(b"static", DashboardFiles(directory))
