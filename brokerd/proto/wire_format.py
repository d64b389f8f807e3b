"""Pieces of protobuf's wire format, for code that puts encoded messages together from parts
instead of serialising a whole message object again."""


def varint(value):
    """The base-128 varint encoding of the non-negative int C{value}."""
    if value < 0x80:
        return _ONE_BYTE[value]
    if value < 0x4000:
        return bytes((value & 0x7F | 0x80, value >> 7))
    if value < 0x200000:
        return bytes((value & 0x7F | 0x80, value >> 7 & 0x7F | 0x80, value >> 14))
    encoded = bytearray()
    while value > 0x7F:
        encoded.append(value & 0x7F | 0x80)
        value >>= 7
    encoded.append(value)
    return bytes(encoded)


_ONE_BYTE = [bytes((value,)) for value in range(0x80)]


def field_key(number, wire_type):
    """The encoded key of field C{number} with C{wire_type} (0 varint, 2 length-delimited)."""
    return varint(number << 3 | wire_type)


VARINT = 0
LENGTH_DELIMITED = 2
