"""A small file system for the disk alarm's tests: a tmpfs of a few megabytes mounted for
one test (root only; the test is skipped, saying why, where mounting is not permitted), and
unmounted afterwards whatever happened, and filler files that take its space."""

import contextlib
import os
import subprocess

import pytest


@contextlib.contextmanager
def small_filesystem(directory, size):
    """Mount a tmpfs of C{size} (as mount's size= option: C{4m}) on C{directory} for the block."""
    directory.mkdir(exist_ok=True)
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(directory)],
                       check=True, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as problem:
        detail = getattr(problem, "stderr", None) or problem
        pytest.skip(f"cannot mount a small tmpfs to fill (needs root): {detail}".strip())
    try:
        yield directory
    finally:
        unmounted = subprocess.run(["umount", str(directory)], capture_output=True, timeout=30)
        if unmounted.returncode != 0:  # still busy (a process left behind): detach it anyway
            subprocess.run(["umount", "-l", str(directory)], capture_output=True, timeout=30)


def free_bytes(directory):
    found = os.statvfs(directory)
    return found.f_bavail * found.f_frsize


def write_filler(path, size):
    """A file of C{size} bytes (fewer if the file system fills first); returns its size."""
    written = 0
    with open(path, "wb", buffering=0) as filler:
        try:
            while written < size:
                written += filler.write(b"\xff" * min(65536, size - written))
        except OSError:
            pass
    return os.path.getsize(path)
