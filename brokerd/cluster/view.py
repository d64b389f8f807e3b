"""
The cluster as etcd holds it, under C{/{prefix}/{cluster}/}: C{leader} (the leader's
L{NodeInfo}, under its lease), C{isr} (the in-sync set: a JSON list of node names), and
C{members/NAME} (each live node's L{NodeInfo}, under its lease). L{ClusterView} is a node's
reading of those keys, kept current by a watch; every value is checked, as anything else read
from etcd.
"""

import json
import re
from dataclasses import dataclass, field

from twisted.logger import Logger

from brokerd.cluster.errors import MalformedResponse

DEFAULT_PREFIX = "brokerd"
# Names become key segments and log words: short, printable, no slash.
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@:-]{0,127}")
MAX_NODE_INFO_BYTES = 16 * 1024

log = Logger()


def check_name(name, what):
    """C{name} if it is a valid node or cluster name, else ValueError naming C{what}."""
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise ValueError(
            f"{what} {name!r} is not 1 to 128 letters, digits or . _ @ : - (starting with a letter "
            "or digit)"
        )
    return name


@dataclass(frozen=True)
class ClusterKeys:
    """The etcd keys of cluster C{cluster} under C{prefix}."""

    cluster: str
    prefix: str = DEFAULT_PREFIX

    def __post_init__(self):
        check_name(self.cluster, "cluster name")
        check_name(self.prefix, "etcd key prefix")

    @property
    def root(self):
        return f"/{self.prefix}/{self.cluster}/".encode()

    @property
    def leader(self):
        return self.root + b"leader"

    @property
    def isr(self):
        return self.root + b"isr"

    @property
    def members(self):
        return self.root + b"members/"

    def member(self, name):
        return self.members + name.encode()


@dataclass(frozen=True)
class NodeInfo:
    """A node's name and the addresses it serves on (label -> address, e.g. C{"amqp"} ->
    C{"tcp:10.0.0.5:5672"}), as its member and leader keys hold them."""

    name: str
    addresses: dict = field(default_factory=dict)

    def __post_init__(self):
        check_name(self.name, "node name")

    def to_json(self):
        return json.dumps({"name": self.name, "addresses": self.addresses}, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data, what):
        """The L{NodeInfo} in C{data} (bytes read from etcd), or L{MalformedResponse}."""
        if len(data) > MAX_NODE_INFO_BYTES:
            raise MalformedResponse(f"{what}: {len(data)} bytes, over {MAX_NODE_INFO_BYTES}")
        try:
            obj = json.loads(data)
        except (ValueError, RecursionError):
            raise MalformedResponse(f"{what}: not JSON: {data[:60]!r}") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("addresses", {}), dict):
            raise MalformedResponse(f"{what}: not an object with a name and addresses")
        addresses = obj.get("addresses", {})
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in addresses.items()):
            raise MalformedResponse(f"{what}: addresses are not labels and strings")
        try:
            return cls(obj.get("name"), addresses)
        except ValueError as error:
            raise MalformedResponse(f"{what}: {error}") from None


def parse_in_sync_set(data, what):
    """The node names of an C{isr} value (a JSON list of names), or L{MalformedResponse}."""
    try:
        names = json.loads(data)
    except (ValueError, RecursionError):
        raise MalformedResponse(f"{what}: not JSON: {data[:60]!r}") from None
    if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
        raise MalformedResponse(f"{what}: not a JSON list of node names")
    return names


class ClusterView:
    """
    What a node knows of its cluster's keys, from a watch of the cluster's root.

    @ivar has_leader: whether the leader key exists (its value may still be unreadable).
    @ivar leader: the leader's L{NodeInfo}, None without a leader (or with an unreadable one).
    @ivar leader_lease: the lease the leader key lives under (0 without a leader).
    @ivar in_sync: the in-sync set's names; None when the key is missing or unreadable.
    @ivar in_sync_revision: the C{isr} key's mod revision (0 when missing), for guarded writes.
    @ivar in_sync_damaged: whether the C{isr} key holds something that is not a list of names.
    @ivar members: name -> L{NodeInfo} of every live member.
    """

    def __init__(self, keys):
        self._keys = keys
        self.reset()

    def reset(self):
        self.has_leader, self.leader, self.leader_lease = False, None, 0
        self.in_sync, self.in_sync_revision, self.in_sync_damaged = None, 0, False
        self.members = {}

    def admits(self, name):
        """Whether C{name} may take the leader key: it is in the in-sync set, or the set is
        missing or empty (a new cluster). A damaged set admits nobody."""
        if self.in_sync_damaged:
            return False
        return not self.in_sync or name in self.in_sync

    def apply(self, kv, deleted):
        """Takes in one key's new state (a L{brokerd.cluster.decode.KeyValue})."""
        where = f"etcd key {kv.key.decode('utf-8', 'replace')}"
        if kv.key == self._keys.leader:
            self.has_leader, self.leader, self.leader_lease = not deleted, None, 0
            if not deleted:
                self.leader, self.leader_lease = self._node(kv.value, where), kv.lease
        elif kv.key == self._keys.isr:
            self.in_sync, self.in_sync_revision, self.in_sync_damaged = None, 0, False
            if not deleted:
                self.in_sync_revision = kv.mod_revision
                try:
                    self.in_sync = parse_in_sync_set(kv.value, where)
                except MalformedResponse as error:
                    log.error("{error}: no node may take the lead until it is fixed", error=error)
                    self.in_sync_damaged = True
        elif kv.key.startswith(self._keys.members):
            name = kv.key[len(self._keys.members):].decode("utf-8", "replace")
            self.members.pop(name, None)
            if not deleted and (info := self._node(kv.value, where)) is not None:
                self.members[name] = info

    @staticmethod
    def _node(data, where):
        try:
            return NodeInfo.from_json(data, where)
        except MalformedResponse as error:
            log.error("{error}", error=error)
            return None
