"""This machine's addresses as tests need them: one a client can connect from that is not loopback."""

import contextlib
import ipaddress
import socket


def non_loopback_address():
    """An IPv4 address of this machine that is not a loopback one (no packet is sent), or None."""
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("192.0.2.1", 9))
        address = probe.getsockname()[0]
        if not ipaddress.ip_address(address).is_loopback:
            return address
    return None
