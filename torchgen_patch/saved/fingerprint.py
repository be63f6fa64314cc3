"""A fingerprint of a tensor's contents, keyed per process, that never differs for two reads of the
same bits: integer arithmetic on the stored bit patterns only (never values, so NaN payloads and
-0.0 count as what they are), in an order that gives the same result whatever the threads.

The bytes read (the *stream*): a tensor whose elements fill one block of memory (contiguous, or any
permutation of the dimensions of a contiguous block: a transposed weight) is read as that block, in
memory order; any other (a slice, a split head, an expanded tensor) as its elements with its dimensions
taken by decreasing stride (of equal strides, the first first): for a slice or a split head, in the order
of their addresses.
The stream is cut into NH blocks of 256 little-endian 32-bit words (1 KiB; the last one padded with
zero words), and

    fingerprint = sum over blocks j of  W(j) * NH(block j)                      (mod 2**64)
    NH(block)   = sum over i < 128 of (w[2i] + K[2i]) * (w[2i+1] + K[2i+1])     (each sum mod 2**32)

where ``K`` is 256 random 32-bit words and ``W(j)`` an odd 64-bit weight made from a random seed and
``j`` by a bijective mixer; key and seed are drawn from the operating system once per process
(``secrets``), never a constant, so no pattern of changes can be chosen ahead of time to cancel.

What holds (``docs/unseen-writes.md``): NH is 2**-32-almost-universal over blocks of equal length
(Black et al., UMAC): for any two different blocks, chosen without knowledge of ``K``, their NH values
agree with probability at most 2**-32. A change confined to one block is therefore missed with
probability at most 2**-32 (``W(j)`` is odd, so a nonzero NH difference never vanishes mod 2**64);
changes in several blocks are missed when their weighted differences cancel, with the weights unknown
to the writer: about 2**-32 as well. The products are non-linear in the data, so no sign flip, swap
of two values, or any other structured change maps to a fixed difference.

Two implementations give the same number: the check's native hooks (C++ and a CUDA kernel,
``templates/saved/fingerprint.cpp``, ``templates/saved/fingerprint.cu``), and this module, the Python
path used where nothing could be compiled: numpy on CPU, torch's integer ops on any other device
(a 0-d int64 tensor on the device, so nothing waits for it; the caller compares a batch at once).

``fingerprint(t)`` is a tuple of parts (ints, or 0-d device tensors), or a ``Skip`` that says why a
tensor's contents are not read (sparse, nested, meta, no storage of its own).
"""

from __future__ import annotations

import ctypes
import secrets
import threading
from typing import Any, NamedTuple

WORDS = 256  # 32-bit words in an NH block
BLOCK = WORDS * 4  # bytes
CHUNK = 1 << 20  # elements copied at once where a tensor is read element by element (bounded extra memory)
DEVICE_BLOCKS = 1 << 14  # NH blocks per product on a device (16 MiB of words; int64 temporaries of 4x)
_MASK64 = (1 << 64) - 1
_GOLDEN, _M1, _M2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


class Skip(NamedTuple):
    """The contents of this tensor are not fingerprinted (its version still is checked)."""

    reason: str


# ---- the process's key ----------------------------------------------------------------------------

_KEY: list = []
_KEY_LOCK = threading.Lock()


def key() -> bytes:
    """The process's key: 256 NH words and a 64-bit seed (1,032 bytes), drawn once."""
    if not _KEY:
        with _KEY_LOCK:
            if not _KEY:
                _KEY.append(secrets.token_bytes(WORDS * 4 + 8))
    return _KEY[0]


def _nh_key() -> list[int]:
    k = key()
    return [int.from_bytes(k[4 * i:4 * i + 4], "little") for i in range(WORDS)]


def _seed() -> int:
    return int.from_bytes(key()[WORDS * 4:], "little")


def block_weight(j: int) -> int:
    """W(j): the odd weight of NH block ``j`` (splitmix64's mixer of seed + (j + 1) * golden ratio)."""
    z = (_seed() + (j + 1) * _GOLDEN) & _MASK64
    z = ((z ^ (z >> 30)) * _M1) & _MASK64
    z = ((z ^ (z >> 27)) * _M2) & _MASK64
    return (z ^ (z >> 31)) | 1


# ---- which tensors are read, and how ---------------------------------------------------------------


def fingerprint(t):
    """The parts of ``t``'s fingerprint (see the module's docstring), or a ``Skip``."""
    if _PLAIN is None:
        _init()
    if type(t) not in _PLAIN:  # type: ignore[operator]  # _init() set it
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
    why = skip_reason(t)
    if why is not None:
        return Skip(why)
    if not t.numel():
        return (0,)
    if not readable(t):
        return Skip(UNREADABLE)
    if t.is_cpu and not _FORCE_DEVICE_PATH:
        return (_cpu(t),)
    return (_on_device(t),)


UNREADABLE = "a tensor whose storage is smaller than its elements (freed or resized)"
IN_BACKWARD = "saved while a backward pass that keeps no graph ran (a recomputation's)"  # not read, version checked
_FORCE_DEVICE_PATH = False  # tests run the device path on CPU
_PLAIN = None  # the plain tensor types: read directly
_STRIDED = None


def skip_reason(t) -> str | None:
    """Why a plain tensor's contents are not read at all (None: they are)."""
    if t.layout is not _STRIDED:
        return f"{str(t.layout).replace('torch.', '')} tensors"
    if t.is_nested:
        return "nested tensors"
    if t.is_meta:
        return "meta tensors (no data)"
    return None


def _init() -> None:
    global _PLAIN, _STRIDED  # noqa: PLW0603 (torch's types, set once torch is imported)
    import torch

    _STRIDED = torch.strided
    _PLAIN = frozenset(plain_types())


def plain_types() -> tuple:
    """The tensor types read directly: Tensor, Parameter, Buffer (torch >= 2.5)."""
    import torch

    types: list[type] = [torch.Tensor, torch.nn.Parameter]
    buffer = getattr(torch.nn, "Buffer", None)
    if isinstance(buffer, type):
        types.append(buffer)
    return tuple(types)


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


def readable(t) -> bool:
    """Every element of ``t`` lies inside its storage (a storage resized to 0, as FSDP does between
    uses, would make a read fault)."""
    if not t.numel():
        return True  # nothing to read
    last = t.storage_offset()
    for size, stride in zip(t.shape, t.stride(), strict=True):
        if stride < 0:
            return False
        last += (size - 1) * stride
    return (last + 1) * t.element_size() <= t.untyped_storage().nbytes()


def dense(t) -> bool:
    """The elements of ``t`` fill one block of memory exactly, in some order of its dimensions."""
    if t.is_contiguous():
        return True
    expect = 1
    for stride, size in sorted((st, sz) for sz, st in zip(t.shape, t.stride(), strict=True) if sz != 1):
        if stride != expect:
            return False
        expect *= size
    return True


def _bits_of(t):
    """``t`` as a tensor whose copies keep its bit patterns: a bool tensor's bytes as uint8 (a copy of a bool
    tensor writes each byte as 0 or 1, whatever it held)."""
    import torch

    return t.view(torch.uint8) if t.dtype == torch.bool else t


def _pieces(t, limit: int):
    """Views of ``t`` that together cover it in logical order, each of at most ``limit`` elements
    (split along the first dimension, recursively)."""
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


def _by_stride(t):
    """``t`` with its dimensions by decreasing stride (of equal strides, the first first): a view whose
    elements, in logical order, are the stream of a tensor that is not dense."""
    return t.permute(sorted(range(t.dim()), key=lambda d: -t.stride(d)))


def _block_view(t):
    """A dense tensor's block of memory as a 1-d tensor of its elements in memory order (a view)."""
    return t.detach().as_strided((t.numel(),), (1,), t.storage_offset())


# ---- CPU: numpy ------------------------------------------------------------------------------------


class Numpy:
    """numpy and the key as numpy arrays, made on first use (None: numpy is missing)."""

    np: Any = None  # numpy, or False once it is known missing
    nh_key = None

    @classmethod
    def load(cls):
        if cls.np is None:
            try:
                import numpy
            except ImportError:
                cls.np = False
                return False
            cls.np = numpy
            cls.nh_key = numpy.array(_nh_key(), dtype=numpy.uint32)
        return cls.np


def _weights_np(np, first: int, n: int):
    """W(first) .. W(first + n - 1) as uint64."""
    with np.errstate(over="ignore"):
        z = np.uint64(_seed()) + (np.arange(first + 1, first + n + 1, dtype=np.uint64) * np.uint64(_GOLDEN))
        z = (z ^ (z >> np.uint64(30))) * np.uint64(_M1)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(_M2)
        return (z ^ (z >> np.uint64(31))) | np.uint64(1)


def _nh_np(np, words, first: int) -> int:
    """sum of W(first + b) * NH(block b) over the rows of ``words`` (uint32, shape (blocks, 256))."""
    with np.errstate(over="ignore"):
        x = (words + Numpy.nh_key).astype(np.uint64)
        nh = (x[:, 0::2] * x[:, 1::2]).sum(axis=1, dtype=np.uint64)
        return int((nh * _weights_np(np, first, len(nh))).sum(dtype=np.uint64))


class _Stream:
    """A byte stream fed in pieces, fingerprinted a run of whole blocks at a time."""

    def __init__(self, np):
        self.np, self.total, self.blocks, self.rest = np, 0, 0, b""

    def feed(self, data) -> None:
        np = self.np
        if self.rest:
            head = BLOCK - len(self.rest)
            self.rest += bytes(data[:head])
            data = data[head:]
            if len(self.rest) < BLOCK:
                return
            self._add(np.frombuffer(self.rest, dtype=np.uint32).reshape(1, WORDS))
            self.rest = b""
        full = len(data) // BLOCK
        for start in range(0, full, 4096):  # 4 MiB of words at a time
            n = min(4096, full - start)
            self._add(np.frombuffer(data, dtype=np.uint32, count=n * WORDS, offset=start * BLOCK).reshape(n, WORDS))
        self.rest = bytes(data[full * BLOCK:])

    def _add(self, words) -> None:
        self.total = (self.total + _nh_np(self.np, words, self.blocks)) & _MASK64
        self.blocks += len(words)

    def result(self) -> int:
        if self.rest:
            last = self.rest + bytes(BLOCK - len(self.rest))
            self._add(self.np.frombuffer(last, dtype=self.np.uint32).reshape(1, WORDS))
            self.rest = b""
        return self.total


def _cpu(t) -> int:
    """The CPU fingerprint of ``t``: its block of memory read in place when its elements fill one,
    else its elements with its dimensions by decreasing stride, a contiguous copy of a piece at a time."""
    np = Numpy.load()
    if not np:
        return _cpu_without_numpy(t)
    stream = _Stream(np)
    if dense(t):
        nbytes = t.numel() * t.element_size()
        stream.feed(memoryview((ctypes.c_char * nbytes).from_address(t.data_ptr())).cast("B"))
    else:
        for piece in _pieces(_bits_of(_by_stride(t.detach())), CHUNK):
            block = piece.contiguous()
            stream.feed(memoryview((ctypes.c_char * (block.numel() * block.element_size()))
                                   .from_address(block.data_ptr())).cast("B"))
    return stream.result()


def _cpu_without_numpy(t) -> int:
    """The same number in plain Python (no numpy: slow, and only where nothing else is there)."""
    k = _nh_key()
    pieces = [t] if dense(t) else [p.contiguous() for p in _pieces(_bits_of(_by_stride(t.detach())), CHUNK)]
    data = b"".join(ctypes.string_at(p.data_ptr(), p.numel() * p.element_size()) for p in pieces)
    data += bytes(-len(data) % BLOCK)
    total = 0
    for j in range(len(data) // BLOCK):
        w = [int.from_bytes(data[j * BLOCK + 4 * i:j * BLOCK + 4 * i + 4], "little") for i in range(WORDS)]
        nh = sum(((w[i] + k[i]) & 0xFFFFFFFF) * ((w[i + 1] + k[i + 1]) & 0xFFFFFFFF) for i in range(0, WORDS, 2))
        total = (total + block_weight(j) * (nh & _MASK64)) & _MASK64
    return total


# ---- any other device: torch's integer ops ------------------------------------------------------------

_DEVICE_KEYS: dict = {}  # device -> the NH key as int64 on it


def _device_key(device):
    k = _DEVICE_KEYS.get(device)
    if k is None:
        import torch

        k = _DEVICE_KEYS[device] = torch.tensor(_nh_key(), dtype=torch.int64, device=device)
    return k


def _weights_torch(first: int, n: int, device):
    """W(first) .. W(first + n - 1) as int64 on ``device`` (the same bits as the uint64 weights)."""
    import torch

    def signed(v: int) -> int:
        return v - (1 << 64) if v >= 1 << 63 else v

    z = torch.arange(first + 1, first + n + 1, dtype=torch.int64, device=device) * signed(_GOLDEN) + signed(_seed())
    z = (z ^ ((z >> 30) & ((1 << 34) - 1))) * signed(_M1)  # logical shifts of int64: the arithmetic ones, masked
    z = (z ^ ((z >> 27) & ((1 << 37) - 1))) * signed(_M2)
    return (z ^ ((z >> 31) & ((1 << 33) - 1))) | 1


def _nh_torch(words, first: int):
    """sum of W(first + b) * NH(block b) over the rows of ``words`` (int32, shape (blocks, 256)), a 0-d
    int64 tensor on their device."""
    x = (words.to(dtype=_int64()) + _device_key(words.device)) & 0xFFFFFFFF
    nh = (x[:, 0::2] * x[:, 1::2]).sum(dim=1)  # int64 wraps as uint64 does
    return (nh * _weights_torch(first, words.shape[0], words.device)).sum()


def _int64():
    import torch

    return torch.int64


def _on_device(t):
    """The device fingerprint: a 0-d int64 tensor on ``t``'s device (no synchronisation), the same
    number as the native kernel's (and the CPU's, for the same stream)."""
    import torch

    if dense(t):
        pieces = [_block_view(t)]
    else:
        pieces = list(_pieces(_bits_of(_by_stride(t.detach())), CHUNK))
    total, blocks, rest = None, 0, None
    for piece in pieces:
        data = piece.contiguous().reshape(-1).view(torch.uint8)
        if rest is not None:
            data = torch.cat([rest, data])
        full = data.numel() // BLOCK
        for start in range(0, full, DEVICE_BLOCKS):
            n = min(DEVICE_BLOCKS, full - start)
            part = data[start * BLOCK:(start + n) * BLOCK]
            if part.storage_offset() % 4:
                part = part.clone()
            s = _nh_torch(part.view(torch.int32).view(n, WORDS), blocks)
            total = s if total is None else total + s
            blocks += n
        rest = data[full * BLOCK:] if data.numel() % BLOCK else None
    if rest is not None:
        last = torch.zeros(BLOCK, dtype=torch.uint8, device=rest.device)
        last[:rest.numel()] = rest
        s = _nh_torch(last.view(torch.int32).view(1, WORDS), blocks)
        total = s if total is None else total + s
    return total
