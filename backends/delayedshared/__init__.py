"""What the stores share for delayed messages (L{brokerd.interfaces.IDelayedMessageStore}).

Each backend keeps its delayed messages its own way (the map of the whole
feature is in L{brokerd.model.delayeddelivery}); these modules are the parts
they have in common:

  - L{backends.delayedshared.reactorside}: for every store's reactor side,
    the argument checks, the L{HandleLease} of the file-based stores and
    the window that merges what the writer thread found with the delays
    not yet handed to it;
  - L{backends.delayedshared.metafile}: the small meta file the file-based
    stores (filelog, chunked) keep beside their delayed messages;
  - L{backends.delayedshared.sortedruns}: sorted runs of due-time entries
    as arrays, and the L{MemoryBucket} of them, in which the filelog and
    chunked writer threads hold (part of) their due-time index in memory.
"""
