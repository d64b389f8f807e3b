"""Stores of their own for vhosts: where their files live, opening them, removing them.

A vhost created with a backend string (C{add-vhost NAME --backend
sqlite[:options]}) keeps its messages in a store of its own, built by
L{brokerd.storage.registry} from that string with its data under
C{<data-dir>/vhosts/<name>/} (the vhost name percent-encoded, so any name is one
directory) and committing by the broker's C{--sync}. A store that cannot be
built or opened is reported as L{VhostStoreFailed}, naming the vhost and the
problem, so that the broker takes down that vhost alone.
"""

import os
import shutil
from urllib.parse import quote

from twisted.internet import defer
from twisted.logger import Logger
from zope.interface import implementer

from brokerd.interfaces import IVhostStores
from brokerd.storage import registry

VHOSTS_DIRECTORY = "vhosts"

log = Logger()


class VhostStoreFailed(Exception):
    """A vhost's own store cannot be built or opened; the message names the vhost and the
    problem."""

    def __init__(self, vhost, problem):
        Exception.__init__(self, f"the store of vhost '{vhost}' cannot be opened: {problem}")
        self.vhost = vhost
        self.problem = problem


def directory_name(vhost):
    """The directory a vhost's own store keeps its files in, under C{vhosts/}:
    its name, percent-encoded."""
    name = quote(vhost, safe="")
    # "." and ".." are not directories of their own
    return name.replace(".", "%2E") if set(name) == {"."} else name


@implementer(IVhostStores)
class VhostStores:
    """
    Builds, opens and removes the vhosts' own stores of one broker.

    @ivar data_dir: the broker's C{--data-dir}.
    """

    def __init__(self, data_dir, sync_policy, reactor):
        self.data_dir = data_dir
        self.sync_policy = sync_policy
        self.reactor = reactor

    def directory(self, vhost):
        return os.path.join(self.data_dir, VHOSTS_DIRECTORY, directory_name(vhost))

    def make(self, vhost, backend):
        """The (unopened) store C{backend} describes for C{vhost}; raises
        L{registry.BackendError}."""
        return registry.make_store(backend, self.directory(vhost), self.sync_policy,
                                   reactor=self.reactor)

    @defer.inlineCallbacks
    def open(self, vhost, backend):
        """
        Build and open C{vhost}'s store; fires with it, or fails with
        L{VhostStoreFailed} (a store that failed to open is closed again, as
        it may hold a lock or files it opened first).
        """
        try:
            store = self.make(vhost, backend)
        except registry.BackendError as problem:
            raise VhostStoreFailed(vhost, f"--backend {backend!r}: {problem}") from None
        try:
            yield defer.maybeDeferred(store.open)
        except Exception as problem:
            try:
                yield defer.maybeDeferred(store.close)
            except Exception as closing:
                log.debug("closing the store of vhost {vhost!r} that failed to open:"
                          " {problem!r}", vhost=vhost, problem=closing)
            raise VhostStoreFailed(vhost, str(problem) or type(problem).__name__) from None
        return store

    def remove_files(self, vhost):
        """Delete the directory of C{vhost}'s own store (the vhost is deleted and its store
        closed)."""
        shutil.rmtree(self.directory(vhost), ignore_errors=True)


UNREPLICATED = ("a cluster replicates each node's --backend store only: a vhost cannot have a"
                " store of its own in a cluster")


@implementer(IVhostStores)
class NoOwnStores:
    """
    The vhost stores of a cluster's node: none. Every vhost lives on the node's replicated
    store; a vhost with a store of its own is refused, naming why, rather than served
    from a store no follower copies.
    """

    def make(self, vhost, backend):
        raise registry.BackendError(UNREPLICATED)

    def open(self, vhost, backend):
        raise VhostStoreFailed(vhost, UNREPLICATED)

    def remove_files(self, vhost):
        pass
