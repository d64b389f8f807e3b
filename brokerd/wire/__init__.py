"""The plumbing both wire protocols share: read and write buffers, connections
taking turns, back-pressure on the transport, noticing a client that hung up,
the bounded logs of refused and followed connections, endpoint strings, and the
stop signals of the programs that run a reactor."""
