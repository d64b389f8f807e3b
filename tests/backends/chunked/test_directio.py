"""The aligned writer behind the chunked store's direct writes: whatever the
pieces and flushes, the file holds exactly the bytes added, zeros after them,
and writing can resume at any offset of an existing file."""

import os
import random
import shutil
import tempfile

import pytest

from backends.chunked.directio import BLOCK, STAGING_SIZE, AlignedWriter, open_for_writing, write_block


@pytest.fixture
def directory():
    path = tempfile.mkdtemp(prefix="brokerd-directio-test-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def file_of(directory, size):
    path = os.path.join(directory, "chunk")
    descriptor = open_for_writing(path, create=True)
    os.ftruncate(descriptor, size)
    return path, descriptor


def test_pieces_and_flushes_of_any_size_leave_exactly_the_bytes_added_then_zeros(directory):
    generator = random.Random(7)
    size = 3 * STAGING_SIZE
    path, descriptor = file_of(directory, size)
    writer = AlignedWriter(descriptor, BLOCK)
    expected = bytearray()
    while len(expected) < 2 * STAGING_SIZE + 12345:
        piece = generator.randbytes(generator.choice([1, 17, 4095, 4096, 4097, 70000, STAGING_SIZE + 3]))
        writer.write(piece)
        expected += piece
        if generator.random() < 0.3:
            writer.flush()
            with open(path, "rb") as chunk:
                data = chunk.read()
            assert data[BLOCK : BLOCK + len(expected)] == expected
            assert not any(data[BLOCK + len(expected) :]), "what follows the last byte added is zeros"
    writer.flush()
    writer.close()
    os.close(descriptor)
    with open(path, "rb") as chunk:
        data = chunk.read()
    assert data[BLOCK : BLOCK + len(expected)] == expected
    assert not any(data[: BLOCK]) and not any(data[BLOCK + len(expected) :])
    assert os.path.getsize(path) == size


def test_writing_resumes_mid_block_with_the_tail_of_what_is_there(directory):
    path, descriptor = file_of(directory, 4 * BLOCK)
    first = AlignedWriter(descriptor, BLOCK)
    first.write(b"a" * 5000)
    first.flush()
    first.close()
    offset = BLOCK + 5000
    with open(path, "rb") as chunk:
        chunk.seek(offset - offset % BLOCK)
        tail = chunk.read(offset % BLOCK)
    second = AlignedWriter(descriptor, offset, tail)
    assert second.offset == offset
    second.write(b"b" * 100)
    second.flush()
    second.close()
    os.close(descriptor)
    with open(path, "rb") as chunk:
        data = chunk.read()
    assert data[BLOCK : BLOCK + 5100] == b"a" * 5000 + b"b" * 100
    assert not any(data[BLOCK + 5100 :])


def test_a_tail_that_does_not_match_the_offset_is_refused(directory):
    _, descriptor = file_of(directory, BLOCK)
    with pytest.raises(ValueError, match="tail"):
        AlignedWriter(descriptor, BLOCK + 10, b"short")
    os.close(descriptor)


def test_a_block_is_written_padded_with_zeros(directory):
    path, descriptor = file_of(directory, 3 * BLOCK)
    with open(path, "r+b") as chunk:
        chunk.seek(BLOCK)
        chunk.write(b"x" * BLOCK)
    write_block(descriptor, BLOCK, b"footer")
    os.close(descriptor)
    with open(path, "rb") as chunk:
        data = chunk.read()
    assert data[BLOCK : 2 * BLOCK] == b"footer" + bytes(BLOCK - 6)
