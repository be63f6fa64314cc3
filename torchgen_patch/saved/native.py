"""The check's native hooks, once the runtime has loaded them (``use``): the C++ pack and unpack
that autograd calls directly, and what the Python side asks of them. The runtime builds and loads
the library (``runtime/checklib.py``, the trust rules of every library); this stage only uses it,
so the check runs on the Python path wherever nothing was loaded, and says which path runs.

``TORCHGEN_PATCH_CHECK_PATH=python`` (or ``Check(path="python")``) keeps the Python path even where the
native hooks are loaded."""

from __future__ import annotations

import os

from . import attribute
from .fingerprint import IN_BACKWARD, UNREADABLE, key, plain_types

ENV = "TORCHGEN_PATCH_CHECK_PATH"
PATHS = ("native", "python")
_STATE: dict = {"module": None, "why": "the native hooks are not loaded"}
# the native hooks' reasons for a tensor not judged, by code (1, sparse layouts, is counted in Python)
REASONS = {2: "nested tensors", 3: "meta tensors (no data)", 4: UNREADABLE,
           5: "saved while a CUDA graph was captured", 6: UNREADABLE, 7: "the fingerprint kernel did not launch at use",
           8: IN_BACKWARD}


def use(module, cuda_source: str = "", nvrtc: str = "") -> None:
    """Use ``module`` (the loaded library's ``torchgen_patch_saved_module()``) for checks made from now on;
    ``cuda_source``: the fingerprint kernel's source, ``nvrtc``: the NVRTC library that compiles it."""
    module.set_key(key())
    module.set_cuda(cuda_source, nvrtc)
    _STATE.update(module=module, why=None, nvrtc=bool(nvrtc))


def unavailable(why: str) -> None:
    """The native hooks cannot be had in this process: ``why`` (said by ``describe``)."""
    if _STATE["module"] is None:
        _STATE["why"] = why


def loaded() -> bool:
    return _STATE["module"] is not None


def chosen(path: str | None) -> str | None:
    """The path a check asks for (its argument, else $TORCHGEN_PATCH_CHECK_PATH, else None: either). A bad
    argument is refused (ValueError); a bad value of the variable chooses nothing (``variable_problem``
    says so on the check's line): it never costs the process its kernels or its check."""
    if path:
        if path not in PATHS:
            raise ValueError(f"the saved-tensor check's path must be 'native' or 'python', not {path!r}")
        return path
    value = os.environ.get(ENV)
    return value if value in PATHS else None


def variable_problem() -> str | None:
    """What is wrong with $TORCHGEN_PATCH_CHECK_PATH, in words (None: unset, empty or one of PATHS)."""
    value = os.environ.get(ENV)
    if value and value not in PATHS:
        return f"${ENV} is {value!r}, neither 'native' nor 'python'"
    return None


def hooks(check, fallback, path: str | None):
    """The native hooks for ``check`` (None: the Python path runs), ``fallback`` serving the tensors
    they leave to it."""
    path = chosen(path)
    module = _STATE["module"]
    if path == "python":
        return None
    if module is None:
        if path == "native":
            raise RuntimeError(f"the saved-tensor check's native hooks are not available: {_STATE['why']}")
        return None
    return module.Hooks(check, fallback, attribute.STEPS, attribute.kind_of_code, plain_types())


def quiet(on: bool) -> None:
    module = _STATE["module"]
    if module is not None:
        module.quiet(on)


def skip_counts(h) -> dict[str, int]:
    out: dict[str, int] = {}
    for code, n in h.counts().items():
        reason = REASONS.get(code, f"reason {code}")
        out[reason] = out.get(reason, 0) + n
    return out


def describe(check) -> str:
    """Which path ``check`` runs, in words (the line ``enable`` prints), and a bad $TORCHGEN_PATCH_CHECK_PATH."""
    problem = variable_problem()
    return _path_of(check) + (f"; {problem}: ignored, either path may run" if problem else "")


def _path_of(check) -> str:
    if check.path == "python":
        why = "" if chosen(None) == "python" else f" ({_STATE['why']})"
        return f"Python hooks{why}"
    module = _STATE["module"]
    text = f"native hooks (CPU fingerprint: {module.vector_unit()}"
    cuda = check._native.devices()
    if cuda:
        problems = sorted({why for why in cuda.values() if why})
        text += "; CUDA: " + ("kernel" if not problems else f"torch's ops ({'; '.join(problems)})")
    elif _cuda_available():
        text += "; CUDA: " + ("a kernel compiled at the first CUDA tensor" if _STATE.get("nvrtc") else
                              "torch's ops (no NVRTC library found beside torch or CUDA)")
    return text + ")"


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def batching(on: bool) -> None:
    """At use, one launch for all the CUDA tensors a backward node saved (True, the default), or one a tensor."""
    module = _STATE["module"]
    if module is not None:
        module.batching(on)


def launches() -> int:
    """The fingerprint kernel's launches in this process so far (0 where the native hooks are not loaded)."""
    module = _STATE["module"]
    return module.launches() if module is not None else 0


def settle_at_exit(ref) -> None:
    """The findings of passes whose comparisons were still on a device, judged (and said) at exit
    (``ref``: a weak reference to the check, whose ``findings`` wait for them: the native hooks' and those
    of the tensors custom Functions keep on ``ctx``)."""
    check = ref()
    if check is not None:
        _ = check.findings
