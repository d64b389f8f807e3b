"""backends.common.checksum.crc32: the same CRC as zlib's, without letting another thread take the interpreter lock."""

import mmap
import sys
import threading
import zlib

import pytest

from backends.common.checksum import SLICE, crc32


@pytest.mark.parametrize("size", [0, 1, SLICE - 1, SLICE, SLICE + 1, 5 * 1024 + 1, 64 * 1024, 1_000_003])
def test_it_is_zlibs_crc_for_every_size_and_start(size):
    data = bytes((index * 7 + 3) % 256 for index in range(size))
    assert crc32(data) == zlib.crc32(data)
    assert crc32(data, 12345) == zlib.crc32(data, 12345)
    assert crc32(bytearray(data)) == zlib.crc32(data)
    with mmap.mmap(-1, max(size, 1)) as mapped:
        mapped[:size] = data
        assert crc32(memoryview(mapped)[:size]) == zlib.crc32(data)


def steps_of_another_thread_during(work):
    """How many steps a busy second thread made while C{work()} ran on this one."""
    steps, stop, started = [0], threading.Event(), threading.Event()

    def busy():
        started.set()
        while not stop.is_set():
            steps[0] += 1

    interval = sys.getswitchinterval()
    sys.setswitchinterval(0.5)  # the other thread runs only where the lock is let go, not by preemption
    thread = threading.Thread(target=busy)
    try:
        thread.start()
        started.wait()
        before = steps[0]
        work()
        return steps[0] - before
    finally:
        stop.set()
        thread.join()
        sys.setswitchinterval(interval)


def test_large_bodies_are_checksummed_without_letting_the_lock_go():
    body = bytes(range(256)) * 256  # 64 KiB
    # A few calls tell whether zlib lets go (each release may hand the lock away for 0.5 s).
    if not steps_of_another_thread_during(lambda: [zlib.crc32(body) for _ in range(3)]):
        pytest.skip("this zlib keeps the lock for 64 KiB itself")
    assert steps_of_another_thread_during(lambda: [crc32(body) for _ in range(200)]) == 0


def test_isa_l_computes_it_where_it_is_installed():
    from backends.common import checksum

    isal_zlib = pytest.importorskip("isal.isal_zlib")
    assert checksum._fast_crc32 is isal_zlib.crc32
