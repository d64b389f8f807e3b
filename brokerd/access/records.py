"""
The access database's records: a user, a user's permissions on a vhost, the
names and tags they may have, and the refusal a bad change gets.
"""

from brokerd.access.parameters import ParameterRefused, check_user_limits

DEFAULT_VHOST = "/"
DEFAULT_USER = "guest"
DEFAULT_PASS = "guest"
USER_TAGS = ("administrator", "monitoring", "management", "policymaker")
FULL_PERMISSIONS = (".*", ".*", ".*")


class AccessChangeRefused(ValueError):
    """
    A change names an unknown user or vhost, or a bad tag or expression; the
    message says which.
    """


class User:
    """
    One user: its name, its password hash (RabbitMQ's format; None: no password
    login), its tags and its limits (C{max-connections}, C{max-channels}).
    """

    __slots__ = ("name", "password_hash", "tags", "limits")

    def __init__(self, name, password_hash, tags=(), limits=None):
        self.name = name
        self.password_hash = password_hash
        self.tags = tuple(tags)
        self.limits = dict(limits or {})

    def __repr__(self):
        return f"<User {self.name!r} tags={list(self.tags)}>"


class Permissions:
    """
    A user's three regular expressions on one vhost, as RabbitMQ's
    C{set_permissions} takes them.
    """

    __slots__ = ("configure", "write", "read")

    def __init__(self, configure, write, read):
        self.configure, self.write, self.read = configure, write, read

    def __eq__(self, other):
        return isinstance(other, Permissions) and self.as_tuple() == other.as_tuple()

    def as_tuple(self):
        return self.configure, self.write, self.read

    def __repr__(self):
        return f"Permissions{self.as_tuple()!r}"


def check_name(kind, name):
    if not name or len(name.encode()) > 255:
        raise AccessChangeRefused(f"a {kind} name must be 1 to 255 bytes of UTF-8")


def checked_tags(tags):
    """Tags as RabbitMQ keeps them: any words, the known ones among them meaning something here."""
    tags = tuple(tags)
    for tag in tags:
        if not tag or "," in tag:
            raise AccessChangeRefused(f"{tag!r} is not a user tag (known: {', '.join(USER_TAGS)})")
    return tags


def checked_user_limits(limits):
    try:
        return check_user_limits(limits)
    except ParameterRefused as refusal:
        raise AccessChangeRefused(str(refusal)) from None
