"""Autograd's own error for a saved tensor whose version moved, word for word.

A pair of saved-tensor hooks switches autograd's version check off (the engine checks only
tensors it saved itself), so the check redoes it and raises what autograd would have raised:
``one of the variables needed for gradient computation has been modified by an inplace
operation: [TYPE SIZES], which is output N of NODE, is at version V; expected version E
instead. Hint: ...``. The node and output number follow autograd's rules: a tensor saved as an
output of the node that saved it names that node and its output number; any other names the
tensor's grad_fn at the time of use, output 0 (autograd keeps no output number for those).
The prefix, the hint and how the node is named (``Exp`` in newer releases, ``ExpBackward0`` in older
ones) are read once from this torch itself, by a real version error in a thread of its own
(saved-tensor hooks are per thread, so that thread has none)."""

from __future__ import annotations

import threading
import warnings

_LEGACY = {"float32": "Float", "float64": "Double", "float16": "Half", "int64": "Long", "int32": "Int",
           "int16": "Short", "int8": "Char", "uint8": "Byte"}
_KEYS = {"cpu": "CPU", "cuda": "CUDA", "meta": "Meta", "xpu": "XPU", "mps": "MPS", "hpu": "HPU"}
_TEXT: dict[bool, tuple[str, str, bool]] = {}  # anomaly mode on? -> (prefix, hint, names shortened?)


def type_string(t) -> str:
    """How autograd's message names a tensor's type: ``torch.FloatTensor``, ``torch.cuda.HalfTensor``
    for the legacy types, ``CPUBFloat16Type`` for the others."""
    dtype = str(t.dtype).replace("torch.", "")
    device = t.device.type
    import torch

    if t.layout == torch.strided and dtype in _LEGACY and device in ("cpu", "cuda"):
        return f"torch.{'cuda.' if device == 'cuda' else ''}{_LEGACY[dtype]}Tensor"
    scalar = t.type().rsplit(".", 1)[-1].removesuffix("Tensor")  # torch.BFloat16Tensor -> BFloat16
    key = _KEYS.get(device, device.upper())
    if t.layout == torch.sparse_coo:
        key = "Sparse" + key
    return f"{key}{scalar}Type"


def short_name(node, short: bool = True) -> str:
    """A node's name as the message prints it: shortened (``short``: the releases that do),
    ``ExpBackward0`` -> ``Exp``, ``PowBackward2`` -> ``Pow2``, ``FBackward`` (a custom Function
    ``F``) -> ``F``; else the name itself."""
    name = node.name()
    i = name.rfind("Backward") if short else -1
    if i < 0:
        return name
    rest = name[i + len("Backward"):]
    return name[:i] + ("" if rest == "0" else rest)


def _probe(out: dict) -> None:
    import torch

    a = torch.ones(1, requires_grad=True)
    b = a.exp()  # saves its output
    with torch.no_grad():
        b.add_(0)
    try:
        b.sum().backward()
    except RuntimeError as e:
        out["text"] = str(e)


def _text(anomaly: bool) -> tuple[str, str, bool]:
    """(the message's words before the tensor, its hint, whether it shortens node names), as this torch
    writes them."""
    got = _TEXT.get(anomaly)
    if got is None:
        out: dict = {}
        with warnings.catch_warnings():  # anomaly mode warns with the probe's own forward traceback
            warnings.simplefilter("ignore")
            th = threading.Thread(target=_probe, args=(out,), name="torchgen-patch-probe")
            th.start()
            th.join()
        text = out.get("text", "")
        if "[" not in text or " instead." not in text:  # a torch that words it otherwise: its usual form
            text = ("one of the variables needed for gradient computation has been modified by an inplace operation: "
                    "[ instead.")
        short = " of ExpBackward0," not in text  # the probe's node: exp saved its output
        got = _TEXT[anomaly] = (text[:text.index("[")], text[text.index(" instead.") + len(" instead."):], short)
    return got


def version_error(t, expected: int, now: int, *, leaf: bool, output: bool, output_nr: int, node, grad_fn) -> str:
    """The message. ``leaf``: the tensor was a leaf when saved; ``output``: it was an output of the
    node that saved it (``node``, the one running now); ``grad_fn``: the tensor's grad_fn now."""
    import torch

    prefix, hint, short = _text(torch.is_anomaly_enabled())
    try:
        sizes = "[" + ", ".join(str(s) for s in t.shape) + "]"
    except RuntimeError:  # nested tensors have no one shape
        sizes = "[]"
    if leaf:
        shown, nr = grad_fn, 0
    elif output:
        shown, nr = node, output_nr
    else:
        shown, nr = grad_fn if grad_fn is not None else node, 0
    clause = f", which is output {nr} of {short_name(shown, short)}," if shown is not None else ""
    return f"{prefix}[{type_string(t)} {sizes}]{clause} is at version {now}; expected version {expected} instead.{hint}"
