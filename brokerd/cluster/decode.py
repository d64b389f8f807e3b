"""
Reading etcd's JSON answers as hostile input: every field is checked for its type before use,
int64 fields (which the gateway writes as strings) are parsed strictly, keys and values are
base64-decoded, and a field the gateway leaves out stands for its zero value, as in proto3.
Every failure is a L{MalformedResponse} naming the field and what was wrong with it.
"""

import base64
import binascii
import json
from dataclasses import dataclass

from brokerd.cluster.errors import MalformedResponse

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def parse_json_object(data, what):
    """The JSON object in C{data} (bytes), or L{MalformedResponse} naming C{what} answered."""
    try:
        value = json.loads(data)
    except (ValueError, RecursionError) as error:
        shown = data[:60].decode("utf-8", "replace")
        raise MalformedResponse(f"{what} answered something that is not JSON ({error}): {shown!r}")
    return json_object(value, what)


def json_object(value, what):
    """C{value} if it is a JSON object, or L{MalformedResponse}."""
    if not isinstance(value, dict):
        raise MalformedResponse(f"{what}: expected a JSON object, got {type(value).__name__}")
    return value


def integer(obj, name, what):
    """An int64 field (a decimal string, or a number), 0 when absent."""
    value = obj.get(name, 0)
    if isinstance(value, str):
        text = value[1:] if value.startswith("-") else value
        if not (text.isascii() and text.isdigit() and len(text) <= 19):
            raise MalformedResponse(f"{what}: field {name!r} is not an integer: {value[:40]!r}")
        value = int(value)
    elif isinstance(value, bool) or not isinstance(value, int):
        raise MalformedResponse(f"{what}: field {name!r} is not an integer: {type(value).__name__}")
    if not INT64_MIN <= value <= INT64_MAX:
        raise MalformedResponse(f"{what}: field {name!r} is out of the int64 range")
    return value


def boolean(obj, name, what):
    """A bool field, False when absent."""
    value = obj.get(name, False)
    if not isinstance(value, bool):
        raise MalformedResponse(f"{what}: field {name!r} is not a boolean: {type(value).__name__}")
    return value


def text(obj, name, what):
    """A string field, "" when absent."""
    value = obj.get(name, "")
    if not isinstance(value, str):
        raise MalformedResponse(f"{what}: field {name!r} is not a string: {type(value).__name__}")
    return value


def array(obj, name, what):
    """A list field, [] when absent."""
    value = obj.get(name, [])
    if not isinstance(value, list):
        raise MalformedResponse(f"{what}: field {name!r} is not a list: {type(value).__name__}")
    return value


def member(obj, name, what):
    """An object field, {} when absent."""
    return json_object(obj.get(name, {}), f"{what}: field {name!r}")


def raw_bytes(obj, name, what):
    """A bytes field (base64 in the gateway's JSON), b"" when absent."""
    value = text(obj, name, what)
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as error:
        raise MalformedResponse(f"{what}: field {name!r} is not valid base64 ({error})")


def encode(data):
    """C{data} (bytes or str) as the gateway's base64 text."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    return base64.b64encode(data).decode("ascii")


def header_revision(obj, what):
    """The store revision in an answer's C{header}."""
    return integer(member(obj, "header", what), "revision", f"{what} header")


@dataclass(frozen=True)
class KeyValue:
    """One key as etcd keeps it: its bytes, value, revisions and the lease it lives under (0:
    none)."""

    key: bytes
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int


def key_value(value, what):
    """A L{KeyValue} from one of the gateway's C{kv} objects."""
    obj = json_object(value, what)
    return KeyValue(
        key=raw_bytes(obj, "key", what), value=raw_bytes(obj, "value", what),
        create_revision=integer(obj, "create_revision", what),
        mod_revision=integer(obj, "mod_revision", what),
        version=integer(obj, "version", what), lease=integer(obj, "lease", what),
    )


def key_values(obj, what):
    """The L{KeyValue}s of a range answer's C{kvs}."""
    return [key_value(kv, f"{what} kvs[{index}]")
            for index, kv in enumerate(array(obj, "kvs", what))]
