"""What the stores share for delayed messages (L{brokerd.interfaces.IDelayedMessageStore})."""
