"""Bucket lengths: a length rounded up to a power of two, so that a compiled program whose shape
depends on it (a prompt block, a prefill's rows, a scoring window) serves every length in the
bucket and a new length within it does not recompile. Every such rounding calls this function.
"""

from __future__ import annotations


def bucket_length(n: int, minimum: int = 16) -> int:
    """The power of two >= max(n, minimum): prompt blocks are padded to it so new prompt lengths
    reuse a compiled program."""
    return max(minimum, 1 << (int(n) - 1).bit_length())
