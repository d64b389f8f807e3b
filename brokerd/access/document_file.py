"""Writing a file so that, once the call returns, a crash leaves either the old or the new bytes."""

import os


def write_durably(path, data):
    """
    Write C{data} to a temporary file beside C{path}, fsync it, rename it over
    C{path} and fsync the directory, so the new bytes survive a crash once this returns.
    """
    directory_path = os.path.dirname(os.path.abspath(path))
    temporary = path + ".tmp"
    with open(temporary, "wb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)
    directory = os.open(directory_path, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
