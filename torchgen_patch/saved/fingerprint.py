"""A fingerprint of a tensor's contents, computed where the tensor lives, that never differs for
two reads of the same bits: integer arithmetic on the stored bit patterns only (never values, so
NaN payloads and -0.0 count as what they are), in an order that gives the same result whatever
the threads or kernels.

- CPU, a tensor whose elements fill one block of memory (contiguous, or any permutation of
  dimensions of a contiguous block: a transposed weight): a weighted sum mod 2**64 of that
  block's 4-byte words, read in place (no copy of the tensor, no torch op; numpy's integer matrix
  product, about 3 GB/s on one core here), Python's own hash of it below 16 KiB, or CRC-32 where
  numpy is missing.
- CPU, a tensor with gaps or overlaps (a slice, a split head, an expanded tensor): the same sum
  of a contiguous copy made a chunk at a time.
- Any other device (CUDA): the same kind of sum, on the device: the tensor's bit patterns as words
  of at most 4 bytes (an element of 8 bytes is two words), each widened to 64 bits and weighted by a
  random odd constant of its position, summed mod 2**64; the result stays a 0-d tensor on the device,
  so nothing waits for the device (the caller compares a batch of them at once). Where Triton is
  there and a CUDA tensor of 256 K elements or more has its words one after another, one kernel
  reads them once, making each position's weight from the position itself (a bijection of it, made
  odd) and adding its blocks' sums into a slot of a zeroed buffer; the kernel is used on a device
  only after it gave, on a probe tensor, exactly the sum torch's own integer ops give with the same
  weights. Elsewhere (smaller tensors, no Triton, a failed probe, gaps in the words): torch's ops on
  chunks of 4 M words (the product and its sum; after the first chunk, its positions' weights made
  too), the same number.

``fingerprint(t)`` is a tuple of parts (ints, or 0-d device tensors), or a ``Skip`` that says why
a tensor's contents are not read (sparse, nested, meta, no storage of its own).
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
import zlib
from typing import NamedTuple

CHUNK = 1 << 20  # elements read at once where a copy or a temporary is made (bounded extra memory)
DEVICE_CHUNK = 1 << 22  # words per product on a device without the kernel: a temporary of 32 MiB


class Skip(NamedTuple):
    """The contents of this tensor are not fingerprinted (its version still is checked)."""

    reason: str


def fingerprint(t):
    """The parts of ``t``'s fingerprint (see the module's docstring), or a ``Skip``."""
    if _PLAIN is None:
        _init()
    if type(t) not in _PLAIN:
        inner = _inner_tensors(t)
        if inner is None:
            return Skip(f"a {type(t).__name__} (no storage of its own to read)")
        parts: list = []
        for x in inner:
            p = fingerprint(x)
            if isinstance(p, Skip):
                return p
            parts.extend(p)
        return tuple(parts)
    if t.layout is not _STRIDED:
        return Skip(f"{str(t.layout).replace('torch.', '')} tensors")
    if t.is_nested:
        return Skip("nested tensors")
    if t.is_meta:
        return Skip("meta tensors (no data)")
    if not t.numel():
        return (0,)
    if not _readable(t):
        return Skip("a tensor whose storage is smaller than its elements (freed or resized)")
    if t.is_cpu and not _FORCE_DEVICE_PATH:
        return (_cpu(t),)
    return (_on_device(t),)


_FORCE_DEVICE_PATH = False  # tests run the device path on CPU
_PLAIN = None  # the plain tensor types: read directly
_STRIDED = None


def _init() -> None:
    global _PLAIN, _STRIDED
    import torch

    types = {torch.Tensor, torch.nn.Parameter}
    buffer = getattr(torch.nn, "Buffer", None)  # torch >= 2.5
    if isinstance(buffer, type):
        types.add(buffer)
    _STRIDED = torch.strided
    _PLAIN = frozenset(types)


def _inner_tensors(t):
    """The tensors a traceable wrapper subclass (DTensor, a ``__torch_dispatch__`` wrapper) holds, in
    their fixed order; for another subclass, the tensor itself as a plain tensor when it has storage
    of its own (``as_subclass``, ``_make_subclass``); None when it has none (FakeTensor,
    FunctionalTensor)."""
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    if is_traceable_wrapper_subclass(t):
        names, _ = t.__tensor_flatten__()
        inner = [getattr(t, n) for n in names]
        return [x for x in inner if isinstance(x, _tensor_type())]  # DTensor also flattens its mesh
    try:
        if t.untyped_storage().device.type == "meta":  # FakeTensor: no data (and a warning, if asked its pointer)
            return None
        t.data_ptr()
    except Exception:  # noqa: BLE001 — "Cannot access data pointer/storage of ..." (functional tensors)
        return None
    return [t.as_subclass(_tensor_type())]


def _tensor_type():
    import torch

    return torch.Tensor


def _readable(t) -> bool:
    """Every element of ``t`` lies inside its storage (a storage resized to 0, as FSDP does between
    uses, would make a read fault)."""
    if t.is_contiguous():
        return (t.storage_offset() + t.numel()) * t.element_size() <= t.untyped_storage().nbytes()
    last = t.storage_offset()
    for size, stride in zip(t.shape, t.stride()):
        if stride < 0:
            return False
        last += (size - 1) * stride
    return (last + 1) * t.element_size() <= t.untyped_storage().nbytes()


def _dense(t) -> bool:
    """The elements of ``t`` fill one block of memory exactly, in some order of its dimensions."""
    if t.is_contiguous():
        return True
    expect = 1
    for stride, size in sorted((st, sz) for sz, st in zip(t.shape, t.stride()) if sz != 1):
        if stride != expect:
            return False
        expect *= size
    return True


def _cpu(t) -> int:
    """The CPU fingerprint of ``t``: its block of memory read in place when its elements fill one,
    else a contiguous copy of it made a chunk at a time."""
    if _dense(t):
        return _block(t.data_ptr(), t.numel() * t.element_size())
    total = 0
    for k, piece in enumerate(_pieces(t.detach(), CHUNK)):
        block = piece.contiguous()
        total = (total + _block(block.data_ptr(), block.numel() * block.element_size()) * _odd(k)) & _MASK64
    return total


_MASK64 = (1 << 64) - 1
_COLS = 2048  # 4-byte words per row of the weighted sum


def _odd(k: int) -> int:
    """A fixed odd 64-bit constant for piece ``k`` (splitmix64 of k)."""
    z = (k * 0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) | 1


_BLOCK = 4096  # weights made a block at a time, each from its own seed: a longer table starts as a shorter did


class _Numpy:
    """The weights of the CPU sum, made on first use: random odd uint64 per column, and per row as many
    as the largest tensor read so far needs."""

    np = None
    cols = None
    rows = None

    @classmethod
    def load(cls):
        if cls.np is None:
            try:
                import numpy
            except ImportError:  # no numpy: CRC-32 instead
                cls.np = False
                return False
            cls.np = numpy
            cls.cols = cls._table(0, _COLS)
            cls.rows = cls._table(1, _BLOCK)
        return cls.np

    @classmethod
    def _table(cls, seed: int, n: int):
        np = cls.np
        blocks = [np.random.default_rng([0x5A7ED, seed, k]).integers(0, 1 << 63, _BLOCK, dtype=np.uint64) * 2 + 1
                  for k in range(-(-n // _BLOCK))]
        return np.concatenate(blocks)[:n]

    @classmethod
    def row_weights(cls, n: int):
        if len(cls.rows) < n:
            cls.rows = cls._table(1, max(n, 2 * len(cls.rows)))
        return cls.rows


SMALL = 1 << 14  # bytes: below this, Python's own 64-bit hash of a copy is cheaper than numpy's call


_ROWS = 16  # rows widened at a time: a temporary of 256 KiB, which stays in cache


def _block(ptr: int, nbytes: int) -> int:
    """The fingerprint of ``nbytes`` of memory at ``ptr``. Up to ``SMALL`` bytes: Python's hash of
    the bytes (SipHash, 64 bits, fixed for the process). Larger, with numpy: the 4-byte words laid out
    as rows of 2048, widened to 64 bits a few rows at a time, and summed mod 2**64 with the weight
    row[r] * column[c] (random and odd). A change of one word always changes the sum (an odd weight
    times a nonzero difference below 2**32 is never 0 mod 2**64); changes of several go unseen only
    if their weighted differences cancel: about 1 in 2**64 for random bits and at most about 1 in
    2**32 for any pattern of changes (a difference below 2**32 has at most 31 trailing zero bits).
    Without numpy, CRC-32."""
    if nbytes <= SMALL:
        return hash(ctypes.string_at(ptr, nbytes)) & _MASK64
    memory = (ctypes.c_char * nbytes).from_address(ptr)
    np = _Numpy.load()
    if not np:
        return zlib.crc32(memory)
    words = nbytes // 4
    a = np.frombuffer(memory, dtype=np.uint32, count=words)
    rows = words // _COLS
    cols, weights = _Numpy.cols, _Numpy.row_weights(rows + 1)
    total = 0
    if rows:
        matrix = a[:rows * _COLS].reshape(rows, _COLS)
        sums = np.empty(rows, dtype=np.uint64)
        wide = np.empty((min(rows, _ROWS), _COLS), dtype=np.uint64)
        for i in range(0, rows, _ROWS):
            part = matrix[i:i + _ROWS]
            w = wide[:part.shape[0]]
            w[...] = part
            np.matmul(w, cols, out=sums[i:i + part.shape[0]])
        total = int(sums @ weights[:rows])
    rest = a[rows * _COLS:]
    if rest.size:
        total += int(rest.astype(np.uint64) @ cols[:rest.size]) * int(weights[rows])
    if nbytes % 4:
        total += int.from_bytes(bytes(memory[words * 4:]), "little") * _odd(-1)
    return total & _MASK64


def _pieces(t, limit: int):
    """Views of ``t`` that together cover it in order, each of at most ``limit`` elements (split along
    the first dimension, recursively)."""
    if t.numel() <= limit or t.dim() == 0:
        yield t
        return
    row = t[0].numel()
    if row > limit:
        for i in range(t.shape[0]):
            yield from _pieces(t[i], limit)
        return
    step = max(1, limit // max(row, 1))
    for i in range(0, t.shape[0], step):
        yield t[i:i + step]


_WEIGHTS: dict = {}  # device -> the weights of words 0 .. DEVICE_CHUNK - 1 (32 MiB, made once per device)


def _weights(device):
    w = _WEIGHTS.get(device)
    if w is None:
        w = _WEIGHTS[device] = _position_weights(0, DEVICE_CHUNK, device)
    return w


def _bits(t):
    """``t``'s bit patterns as a signed integer tensor of the same element size (a view, no copy)."""
    import torch

    if t.is_complex():
        t = torch.view_as_real(t)
    signed = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return t if t.dtype == signed else t.view(signed)


def _words(piece):
    """``piece``'s bit patterns as signed integers of at most 4 bytes: itself, or, for 8-byte
    elements, its elements in order as pairs of 4-byte words (a copy where they are not laid out one
    after another: a viewed dtype needs a last stride of 1, which a contiguous column need not have)."""
    import torch

    if piece.element_size() < 8:
        return piece
    flat = piece.reshape(-1)
    if flat.stride(0) != 1:
        flat = torch.empty(flat.shape, dtype=flat.dtype, device=flat.device).copy_(flat)
    return flat.view(torch.int32)


def _on_device(t):
    """The device fingerprint: a 0-d int64 tensor on ``t``'s device (no synchronisation), the sum
    mod 2**64 of word i of ``t`` (in its elements' order) times the weight of position i, by the
    kernel or by torch's ops (the same number). A change of one word always changes it (an odd
    weight times a nonzero difference below 2**32 is never 0 mod 2**64); changes of several are
    missed as the CPU sum's are. Each position's weight is made from a bijection of it (made odd, two
    positions share one with a chance of about 2**-63 a pair), so a value moved from one word to
    another does not cancel."""
    import torch

    bits = _bits(t.detach())
    if bits.is_cuda and bits.numel() >= _KERNEL_MIN and bits.is_contiguous() and _kernel_for(bits.device) is not None:
        return _kernel_sum(_words(bits))
    per = 2 if bits.element_size() == 8 else 1  # words per element
    total, start = None, 0
    for piece in _pieces(bits, DEVICE_CHUNK // per):
        words = _words(piece)
        n = words.numel()
        w = _weights(words.device)[:n] if start == 0 else _position_weights(start, n, words.device)
        s = torch.mul(words, w.view(words.shape)).sum()  # int64, as the weights
        total = s if total is None else total + s
        start += n
    return total


# The weight of word i: a bijection of i and the process's seed (a multiply by an odd constant and
# two xorshifts, each invertible mod 2**64), made odd (so two values that differ in the lowest bit
# only give one weight). torch's int64 ops and the kernel's wrap alike.
_M1, _M2 = -4658895280553007687, -7723592293110705685  # 0xBF58476D1CE4E5B9, 0x94D049BB133111EB as int64
_SEED: list = []  # the process's seed, made once


def _seed() -> int:
    if not _SEED:
        import secrets

        _SEED.append(secrets.randbits(62))
    return _SEED[0]


def _position_weights(start: int, n: int, device):
    """The odd weights of words ``start`` .. ``start + n - 1`` (int64 on ``device``), as the kernel makes them."""
    import torch

    z = torch.arange(start, start + n, dtype=torch.int64, device=device) ^ _seed()
    z = z * _M1
    z = z ^ ((z >> 31) & ((1 << 33) - 1))  # a logical shift of an int64: the arithmetic one, masked
    z = z * _M2
    z = z ^ ((z >> 29) & ((1 << 35) - 1))
    return z | 1


_KERNELS: dict = {}  # device -> the Triton kernel, once its probe matched; None where it is not used
_UNPROBED = object()
_KERNEL_LOCK = threading.RLock()
_SLOTS: dict = {}  # device -> [zeroed int64 buffer, next free slot]
_KERNEL_BLOCK = 4096
_KERNEL_MIN = 1 << 18  # elements: below, torch's two kernels (launched faster than Triton's) read little


def _kernel_for(device):
    """The Triton kernel for ``device``, or None (no Triton, or its probe did not give torch's sum);
    probed once, by one thread, before any fingerprint uses it."""
    kernel = _KERNELS.get(device, _UNPROBED)
    if kernel is not _UNPROBED:
        return kernel
    with _KERNEL_LOCK:
        if device not in _KERNELS:
            _KERNELS[device] = _probed(device)
        return _KERNELS[device]


def _probed(device):
    """The kernel, if on ``device`` it gives exactly torch's own sum for words of 4, 2 and 1 bytes over
    full blocks and a partial one; else None."""
    try:
        kernel = _make_kernel()
        import torch

        g = torch.Generator().manual_seed(7)
        n = 3 * _KERNEL_BLOCK + 5
        for dtype in (torch.int32, torch.int16, torch.int8):
            info = torch.iinfo(dtype)
            probe = torch.randint(info.min, info.max, (n,), generator=g, dtype=dtype).to(device)
            want = (probe.to(torch.int64) * _position_weights(0, n, device)).sum()
            if not bool(_launch(kernel, probe) == want):
                return None
        return kernel
    except Exception:  # noqa: BLE001 — no Triton, no compiler for it, a kernel that fails: torch's ops instead
        return None


def _make_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def weighted_sum(words, out, n, seed, BLOCK: tl.constexpr):
        i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        inside = i < n
        v = tl.load(words + i, mask=inside, other=0).to(tl.int64)
        z = i ^ seed
        z = z * -4658895280553007687  # _M1
        z = z ^ ((z >> 31) & 8589934591)
        z = z * -7723592293110705685  # _M2
        z = z ^ ((z >> 29) & 34359738367)
        w = z | 1
        tl.atomic_add(out, tl.sum(tl.where(inside, v * w, 0), axis=0))

    return weighted_sum


def _kernel_sum(words):
    """The weighted sum of the contiguous ``words`` (int8/16/32) by the kernel ``_kernel_for`` gave."""
    return _launch(_KERNELS[words.device], words)


def _launch(kernel, words):
    """``kernel`` run on ``words``: a 0-d int64 view of a slot of a zeroed buffer (one kernel launch; a
    new buffer every 65,536 slots; slots handed out under the lock, so two threads never share one)."""
    import torch

    with _KERNEL_LOCK:
        slots = _SLOTS.get(words.device)
        if slots is None or slots[1] == slots[0].numel():
            slots = _SLOTS[words.device] = [torch.zeros(1 << 16, dtype=torch.int64, device=words.device), 0]
        out = slots[0][slots[1]]
        slots[1] += 1
    n = words.numel()
    with torch.cuda.device(words.device) if words.is_cuda else contextlib.nullcontext():
        # Triton launches on the current device and its stream: the tensor's own, as torch's ops would
        kernel[(-(-n // _KERNEL_BLOCK),)](words.reshape(-1), out, n, _seed(), BLOCK=_KERNEL_BLOCK)
    return out
