"""Buckets: a size rounded up so that a compiled program whose shape depends on it serves every
size in the bucket and a new size within it does not recompile. Lengths (a prompt block, a
prefill's window, a scoring window, the output columns of a decode call) are rounded up to a
power of two by ``bucket_length``; row counts (a batch, a prefill's rows) by ``bucket_rows``,
which also makes them a multiple of a mesh's ``data`` axis. Every such rounding calls these.
"""

from __future__ import annotations


def bucket_length(n: int, minimum: int = 16) -> int:
    """The power of two >= max(n, minimum): prompt blocks are padded to it so new prompt lengths
    reuse a compiled program."""
    return max(minimum, 1 << (int(n) - 1).bit_length())


def bucket_rows(n: int, multiple: int = 1) -> int:
    """Rows of the programs that run ``n`` rows: the power of two >= n, rounded up to a multiple of
    ``multiple`` (the ``data`` axis of a mesh, which splits the rows evenly): fewer than twice
    the rows asked for off a mesh."""
    return round_up(bucket_length(n, minimum=1), multiple)


def round_up(n: int, multiple: int) -> int:
    """The multiple of ``multiple`` >= n."""
    return -(-int(n) // multiple) * multiple
