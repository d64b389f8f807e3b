"""What several backends share.

Its modules hold:

  - the life of the writer thread every durable store owns
    (L{backends.common.writer_thread}) and the topology the file-based stores
    keep in memory and in one small file (L{backends.common.topology_file});
  - small file-system steps (L{backends.common.fileio}), checksums
    (L{backends.common.checksum}), option checking (L{backends.common.options});
  - the L{MessageRecord<brokerd.interfaces.MessageRecord>} every store hands back
    (L{backends.common.message_record}) and the quarantine of records a store holds
    but cannot read back (L{backends.common.quarantine});
  - delayed messages (L{brokerd.interfaces.IDelayedMessageStore}), which each
    backend keeps its own way (the map of the whole feature is in
    L{brokerd.model.delayeddelivery}): the reactor side's argument checks, handle
    leases and the window that merges what the writer thread found with the delays
    not yet handed to it (L{backends.common.delayed_requests}); the small meta file
    of the file-based stores (L{backends.common.delayed_meta}); sorted runs of
    due-time entries as arrays (L{backends.common.sorted_runs}) and the numbers kept
    per handle (L{backends.common.handle_map}).
"""
