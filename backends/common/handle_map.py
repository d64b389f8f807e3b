"""L{HandleMap}: a few numbers per delayed-message handle, kept in arrays, not objects.

The delayed-message stores give out handles from one increasing counter and
must answer, for millions of kept handles, "is this one kept?" and "where is
it?" without a Python object per handle. Handles are grouped in blocks of
C{BLOCK} consecutive numbers. A block is I{dense} (a presence byte and one
array slot per value for every handle of the block, about C{1 + sum of item
sizes} bytes per handle) while many of its handles are kept, and turns
I{sparse} (sorted offsets and values of the kept handles only) once few are,
so that a few long-delayed messages among many released ones cost a few bytes
each rather than a whole block.
"""

from array import array
from bisect import bisect_left

BLOCK_BITS = 10
BLOCK = 1 << BLOCK_BITS
MASK = BLOCK - 1
SPARSE_BELOW = BLOCK // 32  # a dense block (not the newest) with fewer kept handles turns sparse


class _Dense:
    __slots__ = ("count", "present", "values")

    def __init__(self, typecodes):
        self.count = 0
        self.present = bytearray(BLOCK)
        self.values = [array(code, bytes(BLOCK * array(code).itemsize)) for code in typecodes]


class _Sparse:
    __slots__ = ("offsets", "values")

    def __init__(self, dense):
        present, offsets, start = dense.present, array("H"), 0
        while True:
            start = present.find(1, start)
            if start < 0:
                break
            offsets.append(start)
            start += 1
        self.offsets = offsets
        self.values = [array(column.typecode, map(column.__getitem__, offsets))
                       for column in dense.values]

    def find(self, offset):
        offsets = self.offsets
        index = bisect_left(offsets, offset)
        return index if index < len(offsets) and offsets[index] == offset else None


class HandleMap:
    """
    Kept handles, each with the same number of values (ints of the array
    C{typecodes}, e.g. C{("Q", "I")}); a map without typecodes is a set.
    """

    def __init__(self, typecodes=()):
        self.typecodes = tuple(typecodes)
        self._blocks = {}  # block number -> _Dense or _Sparse
        self._count = 0
        self._newest = -1  # number of the block of the highest handle added: never made sparse

    def __len__(self):
        return self._count

    def __contains__(self, handle):
        block = self._blocks.get(handle >> BLOCK_BITS)
        if block is None:
            return False
        if type(block) is _Dense:
            return block.present[handle & MASK] == 1
        return block.find(handle & MASK) is not None

    def get(self, handle):
        """The values of C{handle} (a tuple, empty for a set), or None if it is not kept."""
        block = self._blocks.get(handle >> BLOCK_BITS)
        if block is None:
            return None
        offset = handle & MASK
        if type(block) is _Dense:
            if not block.present[offset]:
                return None
            return tuple(column[offset] for column in block.values)
        index = block.find(offset)
        return None if index is None else tuple(column[index] for column in block.values)

    def add(self, handle, *values):
        """Keep C{handle} with C{values} (replacing the values if it is kept already)."""
        if handle < 0:
            raise ValueError(f"a handle is a natural number, not {handle!r}")
        number, offset = handle >> BLOCK_BITS, handle & MASK
        block = self._blocks.get(number)
        if block is None:
            block = self._blocks[number] = _Dense(self.typecodes)
            if number > self._newest:
                self._newest = number
        elif type(block) is _Sparse:
            block = self._blocks[number] = self._densify(block)
        if not block.present[offset]:
            block.present[offset] = 1
            block.count += 1
            self._count += 1
        for column, value in zip(block.values, values):
            column[offset] = value

    def add_many(self, handles, *columns):
        """C{add(handles[i], *(column[i] for column in columns))} for every i, faster."""
        blocks, newest, added = self._blocks, self._newest, 0
        for index, handle in enumerate(handles):
            number = handle >> BLOCK_BITS
            block = blocks.get(number)
            if type(block) is not _Dense:
                if handle < 0:
                    raise ValueError(f"a handle is a natural number, not {handle!r}")
                block = _Dense(self.typecodes) if block is None else self._densify(block)
                blocks[number] = block
                newest = max(newest, number)
            offset = handle & MASK
            present = block.present
            if not present[offset]:
                present[offset] = 1
                block.count += 1
                added += 1
            for column, source in zip(block.values, columns):
                column[offset] = source[index]
        self._count += added
        self._newest = newest

    def pop(self, handle):
        """Forget C{handle}; its values (a tuple), or None if it was not kept."""
        number, offset = handle >> BLOCK_BITS, handle & MASK
        block = self._blocks.get(number)
        if block is None:
            return None
        if type(block) is _Dense:
            if not block.present[offset]:
                return None
            values = tuple(column[offset] for column in block.values)
            block.present[offset] = 0
            block.count -= 1
            if block.count == 0:
                del self._blocks[number]
            elif block.count < SPARSE_BELOW and number != self._newest:
                self._blocks[number] = _Sparse(block)
        else:
            index = block.find(offset)
            if index is None:
                return None
            values = tuple(column[index] for column in block.values)
            del block.offsets[index]
            for column in block.values:
                del column[index]
            if not block.offsets:
                del self._blocks[number]
        self._count -= 1
        return values

    def items(self):
        """C{(handle, values)} of every kept handle, in handle order (a snapshot of each block)."""
        for number in sorted(self._blocks):
            block = self._blocks.get(number)
            if block is None:
                continue
            base = number << BLOCK_BITS
            if type(block) is _Dense:
                offsets = [offset for offset in range(BLOCK) if block.present[offset]]
                columns = block.values
                for offset in offsets:
                    yield base + offset, tuple(column[offset] for column in columns)
            else:
                offsets, columns = block.offsets[:], [column[:] for column in block.values]
                for index, offset in enumerate(offsets):
                    yield base + offset, tuple(column[index] for column in columns)

    def _densify(self, sparse):
        dense = _Dense(self.typecodes)
        for index, offset in enumerate(sparse.offsets):
            dense.present[offset] = 1
            for column, values in zip(dense.values, sparse.values):
                column[offset] = values[index]
        dense.count = len(sparse.offsets)
        return dense

    def memory(self):
        """About how many bytes the blocks take (for tests and figures)."""
        total = 0
        for block in self._blocks.values():
            if type(block) is _Dense:
                total += BLOCK + sum(column.itemsize * BLOCK for column in block.values)
            else:
                column_bytes = sum(column.itemsize * len(column) for column in block.values)
                total += 2 * len(block.offsets) + column_bytes
        return total
