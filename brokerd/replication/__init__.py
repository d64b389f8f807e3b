"""
Replication of a leader's stores to followers, by the store contract's own
operations: L{tap.StoreTap} records what a leader's store is asked to change
into an L{stream.OutboundStream}, L{leader.ReplicationServer} streams it to
authenticated followers (L{codec} frames), and on each follower
L{follower.ReplicationClient} hands it to a L{applier.StoreApplier}, which
makes the same calls on a store of any backend and acknowledges its durable
commits. See docs/clustering.rst.
"""
