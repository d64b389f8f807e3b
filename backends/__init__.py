"""Storage backends for brokerd, each an L{brokerd.interfaces.IStoreBackend}
registered under the ``brokerd.backends`` entry-point group."""
