"""
What a node shows of its cluster (the management API, the dashboard, the metrics): every node it
has seen in this run, which one leads, the in-sync set, and, on the leader, how far each follower
lags. L{ClusterStatus} reads a L{brokerd.cluster.leadership.Candidate}'s view when asked, so it
holds no copy that could go stale, and counts the leader changes the candidate reports to it.
"""

from dataclasses import dataclass, field


@dataclass(frozen=True)
class FollowerLag:
    """
    One follower as the leader's replication sees it: the last operation it acknowledged, whether
    the leader counts it in sync, how far behind it is (operations and bytes), and whether (and how
    often) the leader paused sending to it.
    """

    node: str
    acked: int = 0
    in_sync: bool = False
    lag_operations: int = 0
    lag_bytes: int = 0
    paused: bool = False
    pauses: int = 0

    @classmethod
    def of(cls, entry):
        """The L{FollowerLag} of one dict of the followers callable, its fields' types checked
        (a ValueError names the field), unknown keys ignored."""
        values = {"node": entry.get("node")}
        if not isinstance(values["node"], str):
            raise ValueError(f"follower entry without a node name: {entry!r}")
        for name, kind in (("acked", int), ("lag_operations", int), ("lag_bytes", int),
                           ("pauses", int), ("in_sync", bool), ("paused", bool)):
            if name in entry:
                value = entry[name]
                if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
                    raise ValueError(f"follower {values['node']!r}: {name} is not {kind.__name__}")
                values[name] = value
        return cls(**values)


@dataclass(frozen=True)
class NodeStatus:
    """
    One node of the cluster as this node sees it.

    @ivar running: whether it has a live member key (its lease holds).
    @ivar leader: whether it leads (for this node: whether it leads now, fencing included).
    @ivar in_sync: whether it is in the in-sync set (the leader always is).
    @ivar addresses: the addresses it last announced (empty for a node only named in the set).
    @ivar lag_operations: how many operations it is behind the leader: 0 for the leader, the
        follower's lag when this node leads, None where this node cannot know it.
    @ivar lag_bytes: the same in bytes.
    """

    name: str
    running: bool
    leader: bool
    in_sync: bool
    addresses: dict = field(default_factory=dict)
    lag_operations: int = None
    lag_bytes: int = None


class ClusterStatus:
    """
    Cluster C{cluster_name} as node C{node_name} sees it through C{candidate} (a
    L{brokerd.cluster.leadership.Candidate}).

    Chain L{on_leader} to the candidate's C{on_leader} callback: it counts the leader changes (as
    etcd's C{etcd_server_leader_changes_seen_total}: each time a leader is known that is not the
    one known just before, a leader seen at start included) and notes when the current one came.

    @param followers: a callable giving the leader's replication figures, one dict per follower
        (C{node}, C{acked}, C{in_sync}, C{lag_operations}, C{lag_bytes}, C{paused},
        C{pauses}); asked only while this node leads.
    @param clock: what C{seconds()} is read from for L{leader_elected_at} (wall time: it is
        shown); the reactor by default.
    @param min_in_sync: the fewest in-sync replicas the cluster is configured to confirm with,
        shown as given (None: not configured).
    """

    def __init__(self, cluster_name, node_name, candidate, followers=lambda: [], clock=None,
                 min_in_sync=None):
        if clock is None:
            from twisted.internet import reactor as clock
        self.cluster_name = cluster_name
        self.node_name = node_name
        self.min_in_sync = min_in_sync
        self._candidate = candidate
        self._followers = followers
        self._clock = clock
        self._seen = {node_name: {}}  # name -> the addresses it last announced
        self._known_leader = None
        self.leader_changes = 0
        self.leader_elected_at = None  # clock seconds when this node learnt of the current leader

    def on_leader(self, info):
        """The candidate's C{on_leader(info)}: the cluster's leader is now C{info} (a
        L{brokerd.cluster.view.NodeInfo}, or None while there is none)."""
        name = info.name if info is not None else None
        if name is not None and name != self._known_leader:
            self.leader_changes += 1
            self.leader_elected_at = self._clock.seconds()
        elif name is None:
            self.leader_elected_at = None
        self._known_leader = name
        if info is not None:
            self._seen[name] = dict(info.addresses)

    def is_leader(self):
        """Whether this node leads now (its candidate won and its lease is trusted)."""
        return self._candidate.is_leader()

    def leader_name(self):
        """The leader's node name as etcd names it, or None while there is none."""
        view = self._candidate.view
        return view.leader.name if view.has_leader and view.leader is not None else None

    def in_sync_set(self):
        """The in-sync set's node names, sorted (empty while etcd holds none or a damaged one)."""
        return sorted(set(self._candidate.view.in_sync or ()))

    def running_members(self):
        """The names of the nodes with a live member key, sorted."""
        if self._candidate.ended.called:
            return sorted(name for name in self._candidate.view.members if name != self.node_name)
        return sorted(self._candidate.view.members)

    def followers(self):
        """The leader's figures of each follower (L{FollowerLag}s, by node name), or none when
        this node does not lead."""
        if not self.is_leader():
            return []
        return sorted((FollowerLag.of(entry) for entry in self._followers()),
                      key=lambda lag: lag.node)

    def nodes(self):
        """Every node seen in this run (L{NodeStatus}es sorted by name): the members, the names of
        the in-sync set, the leader, and this node."""
        view = self._candidate.view
        for name, info in view.members.items():
            self._seen[name] = dict(info.addresses)
        leader = self.leader_name()
        if leader is not None:
            self._seen[leader] = dict(view.leader.addresses)
        in_sync = set(self.in_sync_set())
        for name in in_sync:
            self._seen.setdefault(name, {})
        running = set(self.running_members())
        leading = self.is_leader()
        lags = {lag.node: lag for lag in self.followers()} if leading else {}
        found = []
        for name in sorted(self._seen):
            is_leader = leading if name == self.node_name else (name == leader and not leading)
            lag = lags.get(name)
            operations, size = (0, 0) if is_leader else (None, None)
            if lag is not None:
                operations, size = lag.lag_operations, lag.lag_bytes
            found.append(NodeStatus(name, name in running, is_leader,
                                    is_leader or name in in_sync, dict(self._seen[name]),
                                    operations, size))
        return found
