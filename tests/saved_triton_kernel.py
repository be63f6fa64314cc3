"""A small Triton kernel for tests/test_saved_triton.py's GPU test (imported only there, where Triton and a
CUDA device are): it doubles its input in place, as a library's kernel writing its input would."""

from __future__ import annotations

import triton
import triton.language as tl

BLOCK = 128


@triton.jit
def _double_kernel(x_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(x_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) * 2, mask=mask)


def grid(n: int) -> tuple[int]:
    return (triton.cdiv(n, BLOCK),)
