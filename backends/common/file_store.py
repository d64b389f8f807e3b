"""What the file-based stores (filelog, chunked) share beyond the writer
thread's life (L{WriterThreadStore}): durable topology kept in memory and
written whole when it changes.

A subclass sets C{self._topology} (a L{backends.common.topology_file.Topology}) and
what L{WriterThreadStore} asks for.
"""

from backends.common.writer_store import WriterThreadStore


class FileStoreBase(WriterThreadStore):
    _topology = None
    _topology_changed = False

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
        return {
            "queues": len(self._topology.queues),
            "exchanges": len(self._topology.exchanges),
            "bindings": len(self._topology.bindings),
            **self._commit_stats(),
        }
