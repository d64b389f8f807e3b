"""What the file-based stores share: durable topology kept in memory and
written whole when it changes, and the life of the L{GroupCommit} whose
writer thread does their file work.

A subclass sets C{self._topology} (a L{backends.topologyfile.Topology}),
C{sync_policy} and C{_reactor}, and provides C{_take_batch()} and
C{_close_files()}.
"""

from twisted.internet import defer

from brokerd.durability import GroupCommit


class FileStoreBase:
    _topology = None
    _topology_changed = False
    _commit = None
    _closed = False

    @defer.inlineCallbacks
    def _start_writer(self, files):
        """
        Start the writer thread that commits batches to C{files} (its
        C{write_batch}) and run C{files.open} on it; its result is what the
        returned Deferred fires with. If opening fails, the writer is stopped.
        """
        self._commit = GroupCommit(self._take_batch, files.write_batch, self.sync_policy, self._reactor, name=self.name)
        self._commit.start()
        try:
            recovery = yield self._commit.call(files.open)
        except BaseException:
            yield self._shut_down()
            raise
        return recovery

    def topology(self):
        return self._topology.records()

    def save_exchange(self, record):
        self._topology.save_exchange(record)
        self._topology_changed = True

    def delete_exchange(self, vhost, name):
        self._topology.delete_exchange(vhost, name)
        self._topology_changed = True

    def save_binding(self, record):
        self._topology.save_binding(record)
        self._topology_changed = True

    def delete_binding(self, record):
        self._topology.delete_binding(record)
        self._topology_changed = True

    def _common_stats(self):
        """The figures every file-based store reports: topology sizes and commits."""
        commit = self._commit
        return {
            "queues": len(self._topology.queues),
            "exchanges": len(self._topology.exchanges),
            "bindings": len(self._topology.bindings),
            "commits": commit.commits if commit is not None else 0,
            "fsyncs": commit.fsyncs if commit is not None else 0,
        }

    def sync(self):
        if self._commit is None:
            return defer.fail(RuntimeError(f"the {self.name} store is not open"))
        return self._commit.sync()

    @defer.inlineCallbacks
    def close(self):
        """Commit what is buffered (fsynced unless the policy is none), then close the files."""
        if self._closed:
            return
        self._closed = True
        yield self._shut_down()

    @defer.inlineCallbacks
    def _shut_down(self):
        try:
            if self._commit is not None:
                yield self._commit.stop()
        finally:
            self._close_files()
