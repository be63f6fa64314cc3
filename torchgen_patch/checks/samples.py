"""Sample inputs for the ops of the plan, built from each op's schema plus a
few per-family recipes where the schema is not enough.

``sample(op, device)`` returns a Sample or raises NoSample with the reason an
op cannot be run here; such an op is reported as not run, never as passing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

LIST_LEN = 2


class NoSample(Exception):
    """This op has no working recipe on this device; the message says why."""


@dataclass
class Sample:
    op: str
    args: list
    kwargs: dict
    written: dict  # argument name -> the value passed (tensor, list of tensors, None)

    def written_tensors(self) -> list[tuple[str, Any]]:
        out: list[tuple[str, Any]] = []
        for name, v in self.written.items():
            if isinstance(v, (list, tuple)):
                out.extend((f"{name}[{i}]", t) for i, t in enumerate(v) if t is not None)
            elif v is not None:
                out.append((name, v))
        return out


# Ops whose kernels exist only for a backend this project cannot feed a
# meaningful input to (they need a forward pass's reserve buffers).
NOT_RUNNABLE = {
    "aten::_cudnn_rnn_backward.out": "needs cuDNN RNN forward state (weight_buf, reserve); no recipe",
    "aten::miopen_rnn_backward.out": "MIOpen (ROCm) only",
    "aten::lstm_mps_backward.out": "MPS (Apple) only",
}


def opoverload(op: str):
    import torch

    base, _, overload = op.split("::", 1)[1].partition(".")
    return getattr(getattr(torch.ops.aten, base), overload or "default")


def sample(op: str, device: str = "cpu") -> Sample:
    if op in NOT_RUNNABLE:
        raise NoSample(NOT_RUNNABLE[op])
    opov = opoverload(op)
    base = op.split("::", 1)[1].split(".", 1)[0]
    recipe = _family(base)
    return _build(op, opov, device, recipe(device, op))


# ---------------------------------------------------------------------------
# The generic builder: one value per schema argument, by type and name.


def _build(op, opov, device, overrides: dict) -> Sample:
    import torch

    args, kwargs, written = [], {}, {}
    for a in opov._schema.arguments:
        t = str(a.type)
        if a.name in overrides:
            v = overrides[a.name]
            v = v() if callable(v) else v
        elif a.has_default_value():
            continue
        else:
            v = _generic(a.name, t, device)
        writes = a.alias_info is not None and a.alias_info.is_write
        if writes:
            written[a.name] = v
        if a.kwarg_only:
            kwargs[a.name] = v
        else:
            args.append(v)
    if not written:
        raise NoSample("the sample writes no tensor")
    _ = torch
    return Sample(op, args, kwargs, written)


def _t(device, *shape, dtype=None):
    import torch

    return torch.rand(shape, device=device, dtype=dtype or torch.float32) + 0.5


def _generic(name: str, t: str, device: str):
    import torch

    if t == "List[Tensor]":
        if name == "out":
            return [torch.empty(0, device=device) for _ in range(LIST_LEN)]
        return [_t(device, 3) for _ in range(LIST_LEN)]
    if t == "Tensor":
        if name == "scalars":  # foreach ops take their per-tensor scalars as a CPU tensor
            return torch.full((LIST_LEN,), 0.5)
        return _t(device)  # a 0-dim tensor: foreach ops broadcast it
    if t in ("Scalar", "number"):
        return 0.5
    if t in ("List[Scalar]", "List[number]"):
        return [0.5] * LIST_LEN
    if t == "float":
        return 0.5
    if t == "int":
        return 1
    if t == "bool":
        return False
    if t == "ScalarType":
        return torch.float32
    raise NoSample(f"no generic value for argument '{name}' of type {t}")


# ---------------------------------------------------------------------------
# Per-family recipes: argument overrides (a value or a thunk)


def _family(base: str):
    for prefix, recipe in _RECIPES:
        if base == prefix or base.startswith(prefix):
            return recipe
    return lambda device, op: {}


def _split(device, op):
    import torch

    x = _t(device, 2, 2)
    return {"self": x, "split_sizes": [1, 1], "split_size": 1, "dim": 1,
            "out": lambda: [torch.empty(2, 1, device=device) for _ in range(2)]}


def _unbind(device, op):
    import torch

    return {"self": _t(device, 2, 2), "dim": 0, "out": lambda: [torch.empty(2, device=device) for _ in range(2)]}


def _cum_helper(device, op):
    import torch

    return {"self": _t(device, 4), "values": lambda: torch.empty(4, device=device),
            "indices": lambda: torch.empty(4, dtype=torch.long, device=device), "dim": 0}


def _fused_optimizer(device, op):
    import torch

    def steps():
        return [torch.ones((), device=device) for _ in range(LIST_LEN)]

    return {
        "state_steps": steps,
        "lr": (lambda: torch.tensor(0.01, device=device)) if "tensor_lr" in op else 0.01,
        "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.0, "lr_decay": 0.0,
        "momentum": 0.9, "dampening": 0.0,
        "amsgrad": True, "maximize": False, "nesterov": False, "is_first_step": False,
    }


def _amp_unscale(device, op):
    import torch

    return {"found_inf": lambda: torch.zeros(1, device=device), "inv_scale": lambda: torch.ones(1, device=device)}


def _histogramdd(device, op):
    import torch

    from ..runtime.dispatcher import has_kernel

    if device != "cpu" and not has_kernel("aten::_histogramdd_bin_edges", device.upper()):
        raise NoSample(f"aten::_histogramdd_bin_edges has no {device.upper()} kernel in this torch")

    return {"self": _t(device, 5, 2), "bins": [3, 3], "out": lambda: [torch.empty(0, device=device) for _ in range(2)]}


def _dequantize(device, op):
    import torch

    if device != "cpu":
        raise NoSample("quantized tensors are CPU-only")

    def qs():
        import warnings

        warnings.filterwarnings("ignore", message=".*quantized tensor creation functions.*deprecated")
        return [torch.quantize_per_tensor(_t(device, 3), 0.1, 0, torch.quint8) for _ in range(LIST_LEN)]

    return {"tensors": qs, "out": lambda: [torch.empty(3) for _ in range(LIST_LEN)]}


def _quantize(device, op):
    import torch

    if device != "cpu":
        raise NoSample("quantized tensors are CPU-only")

    def outs():
        return [torch._empty_affine_quantized([3], scale=0.1, zero_point=0, dtype=torch.quint8)
                for _ in range(LIST_LEN)]

    return {"scales": lambda: torch.full((LIST_LEN,), 0.1, dtype=torch.double),
            "zero_points": lambda: torch.zeros(LIST_LEN, dtype=torch.long),
            "dtype": torch.quint8, "out": outs}


_RECIPES = [
    ("split_with_sizes_copy", _split),
    ("split_copy", _split),
    ("unsafe_split_with_sizes", _split),
    ("unsafe_split", _split),
    ("unbind_copy", _unbind),
    ("_cummax_helper", _cum_helper),
    ("_cummin_helper", _cum_helper),
    ("_fused_", _fused_optimizer),
    ("_amp_foreach_non_finite_check_and_unscale", _amp_unscale),
    ("_histogramdd_bin_edges", _histogramdd),
    ("dequantize", _dequantize),
    ("quantize_per_tensor", _quantize),
]
