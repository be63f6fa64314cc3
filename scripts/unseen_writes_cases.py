"""The programs scripts/unseen_writes.py runs, one per fresh process:

    python scripts/unseen_writes_cases.py case NAME DEVICE [--check warn|raise]
    python scripts/unseen_writes_cases.py train NAME DEVICE

``case``: forward (a tensor saved for backward), the write of the case, backward. It prints one
line, ``unseen-writes: {json}``: the outcome (``silent``: backward ran; ``raises``: autograd's
"modified by an inplace operation"; ``not run``, with what is missing; ``error``, with the
exception), whether the write changed the saved tensor's bits (a case that wrote nothing shows
nothing), and, with ``--check``, what the case gave inside ``torchgen_patch.check_saved(MODE)``:
its findings as the check's JSON renderer writes them. Run under ``torchgen-patch run
[--check-saved]`` the program is the same; the launcher's lines go to stderr.

``train``: a short training loop of a small MLP with the optimizer of the case NAME: the losses,
a digest of the final parameters' bits, and their versions (scripts/unseen_writes.py compares
them unpatched and under ``run``).
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import shutil
import sys
import warnings
from dataclasses import dataclass

MARK = "unseen-writes: "
AUTOGRAD = "modified by an inplace operation"
TRAIN_STEPS = 6


class NotRun(Exception):
    """Something a case needs is missing here: the row says so, with this text."""


@dataclass
class Trial:
    """A case, made ready: ``watched`` is the tensor autograd saved; ``write()`` writes it the
    case's way; ``loss()`` is then the loss whose backward uses it."""

    watched: object
    write: object
    loss: object


# --- what a case needs --------------------------------------------------------------------------


def need(module: str):
    """``module`` imported, or NotRun saying why not."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return importlib.import_module(module)
    except Exception as e:  # noqa: BLE001 — an ImportError, or a library failing at import
        raise NotRun(f"{module} is not importable here ({type(e).__name__}: {str(e).splitlines()[0][:160]})") \
            from None


def need_cuda(device: str) -> None:
    import torch

    if device != "cuda":
        raise NotRun("CUDA only")
    if not torch.cuda.is_available():
        raise NotRun("no CUDA device")


def need_nvcc() -> None:
    """DeepSpeed builds its CUDA ops with nvcc on first use."""
    from torch.utils.cpp_extension import CUDA_HOME

    nvcc = os.path.join(CUDA_HOME, "bin", "nvcc") if CUDA_HOME else None
    if not (nvcc and os.path.exists(nvcc)) and not shutil.which("nvcc"):
        raise NotRun("no nvcc (CUDA_HOME unset and none on PATH): DeepSpeed cannot build its CUDA ops")


def optimizer_class(path: str, device: str):
    """The optimizer class ``path`` (module.Class), its library importable; NotRun otherwise."""
    module, _, name = path.rpartition(".")
    need(path.split(".")[0])
    if path.startswith("deepspeed.") and device == "cuda":
        need_nvcc()
    return getattr(need(module), name)


def construct(cls, params, device: str, **kw):
    """``cls(params)``; a library that has no build of it for ``device`` is a NotRun."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return cls(params, **kw)
    except ValueError as e:
        if "not been implemented" in str(e):  # DeepSpeed: "This op had not been implemented on CPU backend."
            raise NotRun(f"no {device.upper()} build of {cls.__name__} in its library ({e})") from None
        raise


# --- the cases ------------------------------------------------------------------------------------


def _linear(device: str):
    """x (4x8, requires grad) and a parameter w (8x8): ``(x @ w).tanh().sum()`` saves both."""
    import torch

    torch.manual_seed(0)
    x = torch.randn(4, 8, device=device, requires_grad=True)
    w = torch.nn.Parameter(torch.randn(8, 8, device=device))
    return x, w


def data_mul(device: str) -> Trial:
    x, w = _linear(device)
    loss = (x @ w).tanh().sum()
    return Trial(w, lambda: w.data.mul_(2), lambda: loss)


def torch_dlpack(device: str) -> Trial:
    import torch

    x, w = _linear(device)
    loss = (x @ w).tanh().sum()
    return Trial(w, lambda: torch.from_dlpack(w.detach()).mul_(2), lambda: loss)


def optimizer_step(path: str, **kw):
    """A parameter saved for backward, then the optimizer ``path`` stepped before backward."""

    def make(device: str) -> Trial:
        import torch

        cls = optimizer_class(path, device) if "." in path else getattr(torch.optim, path)
        x, w = _linear(device)
        opt = construct(cls, [w], device, **kw)
        loss = (x @ w).tanh().sum()
        w.grad = torch.ones_like(w)
        return Trial(w, opt.step, lambda: loss)

    return make


def triton_in_place(device: str) -> Trial:
    need_cuda(device)
    triton = need("triton")
    import triton.language as tl

    @triton.jit
    def double(ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(ptr + offs, tl.load(ptr + offs, mask=mask) * 2, mask=mask)

    x, w = _linear(device)
    loss = (x @ w).tanh().sum()
    return Trial(w, lambda: double[(1,)](w.detach(), w.numel(), BLOCK=64), lambda: loss)


def liger_cross_entropy(device: str) -> Trial:
    """liger-kernel's cross-entropy writes the gradient into its input, the logits, in forward (its
    Triton kernel stores it there to save memory); a term that saved the logits before (here a
    penalty on their size, as a z-loss is) then gets the gradient's values in backward."""
    need_cuda(device)
    need("triton")
    liger = need("liger_kernel.transformers")
    import torch

    torch.manual_seed(0)
    h = torch.randn(8, 16, device=device, requires_grad=True)
    head = torch.nn.Parameter(torch.randn(16, 32, device=device))
    target = torch.randint(0, 32, (8,), device=device)
    logits = h @ head
    penalty = logits.pow(2).mean()  # saves the logits
    done = {}

    def write():
        done["ce"] = liger.LigerCrossEntropyLoss()(logits, target)

    return Trial(logits, write, lambda: done["ce"] + 1e-3 * penalty)


def liger_rope(device: str) -> Trial:
    """liger-kernel's RoPE rotates q and k in place when their memory is laid out as the attention
    projections' output viewed (batch, heads, tokens, head_dim), as transformers' Llama makes them: a
    term that saved q before (here q * q) gets the rotated values in backward."""
    need_cuda(device)
    need("triton")
    rope = need("liger_kernel.transformers.rope")
    import torch

    torch.manual_seed(0)
    b, s, heads, d = 2, 8, 4, 16
    x = torch.randn(b, s, 32, device=device, requires_grad=True)
    wq = torch.nn.Parameter(torch.randn(32, heads * d, device=device))
    wk = torch.nn.Parameter(torch.randn(32, heads * d, device=device))
    q = (x @ wq).view(b, s, heads, d).transpose(1, 2)
    k = (x @ wk).view(b, s, heads, d).transpose(1, 2)
    aux = (q * q).sum()  # saves q
    angles = torch.arange(s, device=device)[:, None] * torch.rand(1, d, device=device)
    cos, sin = angles.cos()[None], angles.sin()[None]
    done = {}

    def write():
        done["q"], done["k"] = rope.liger_rotary_pos_emb(q, k, cos, sin)

    return Trial(q, write, lambda: aux + done["q"].sum() + done["k"].sum())


def cupy_dlpack(device: str) -> Trial:
    need_cuda(device)
    cupy = need("cupy")
    x, w = _linear(device)
    loss = (x @ w).tanh().sum()

    def write():
        a = cupy.from_dlpack(w.detach())
        a *= 2

    return Trial(w, write, lambda: loss)


def cupy_raw_kernel(device: str) -> Trial:
    """A hand-written CUDA kernel (CuPy's RawKernel, compiled by NVRTC) given the parameter's
    data_ptr() as a raw pointer."""
    need_cuda(device)
    cupy = need("cupy")
    twice = cupy.RawKernel(r'''
        extern "C" __global__ void twice(float* p, int n) {
            int i = blockDim.x * blockIdx.x + threadIdx.x;
            if (i < n) p[i] *= 2.0f;
        }''', "twice")
    x, w = _linear(device)
    loss = (x @ w).tanh().sum()

    def write():
        n = w.numel()
        memory = cupy.cuda.UnownedMemory(w.data_ptr(), n * w.element_size(), w)
        array = cupy.ndarray((n,), cupy.float32, cupy.cuda.MemoryPointer(memory, 0))
        twice((1,), (64,), (array, cupy.int32(n)))

    return Trial(w, write, lambda: loss)


def cuda_graph_replay(device: str) -> Trial:
    """A captured optimizer step (AdamW, capturable), replayed: the replay runs the captured kernels
    and no operator, so nothing moves a version."""
    need_cuda(device)
    import torch

    x, w = _linear(device)
    opt = torch.optim.AdamW([w], lr=0.1, capturable=True, foreach=True)
    w.grad = torch.ones_like(w)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):  # warm-up, as capture needs
            opt.step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        opt.step()
    loss = (x @ w).tanh().sum()
    return Trial(w, graph.replay, lambda: loss)


@dataclass(frozen=True)
class Case:
    what: str  # the row's text (markdown)
    make: object  # device -> Trial
    optimizer: str | None = None  # the optimizer class it steps, for its optimizer entry
    devices: tuple[str, ...] = ("cpu", "cuda")  # where the case exists


DEEPSPEED = {"deepspeed-fused-adam": "deepspeed.ops.adam.fused_adam.FusedAdam",
             "deepspeed-fused-lamb": "deepspeed.ops.lamb.fused_lamb.FusedLamb",
             "deepspeed-fused-lion": "deepspeed.ops.lion.fused_lion.FusedLion"}
# the fused optimizers of the libraries large runs use (Megatron's: Transformer Engine, apex), where installed
OTHER_FUSED = {"transformer-engine-fused-adam": "transformer_engine.pytorch.optimizers.FusedAdam",
               "apex-fused-adam": "apex.optimizers.FusedAdam",
               "apex-fused-lamb": "apex.optimizers.FusedLAMB",
               "colossalai-hybrid-adam": "colossalai.nn.optimizer.HybridAdam"}

CASES = {
    "data-mul": Case("`p.data.mul_(2)`", data_mul),
    "torch-dlpack": Case("`torch.from_dlpack(p.detach()).mul_(2)`", torch_dlpack),
    "torch-fused-adamw": Case("`torch.optim.AdamW(fused=True)` stepped between forward and backward",
                              optimizer_step("AdamW", lr=0.1, fused=True)),
    **{name: Case(f"DeepSpeed's `{path.rsplit('.', 1)[1]}` (`{path.rsplit('.', 2)[0]}`) stepped between forward and "
                  "backward", optimizer_step(path), optimizer=path) for name, path in DEEPSPEED.items()},
    "triton-in-place": Case("a hand-written Triton kernel writing its input in place", triton_in_place,
                            devices=("cuda",)),
    "liger-cross-entropy": Case("liger-kernel's `LigerCrossEntropyLoss` (writes the gradient into the logits in "
                                "forward) after a term that saved the logits", liger_cross_entropy, devices=("cuda",)),
    "liger-rope": Case("liger-kernel's `liger_rotary_pos_emb` (rotates q and k in place) after a term that saved q",
                       liger_rope, devices=("cuda",)),
    "cupy-dlpack": Case("CuPy through DLPack: `a = cupy.from_dlpack(p.detach()); a *= 2`", cupy_dlpack,
                        devices=("cuda",)),
    "cupy-raw-kernel": Case("a hand-written CUDA kernel (CuPy `RawKernel`) given `p.data_ptr()`", cupy_raw_kernel,
                            devices=("cuda",)),
    "cuda-graph-replay": Case("a captured optimizer step (`torch.cuda.graph`, AdamW `capturable=True`) replayed",
                              cuda_graph_replay, devices=("cuda",)),
    **{name: Case(f"`{path}` stepped between forward and backward", optimizer_step(path), optimizer=path,
                  devices=("cuda",)) for name, path in OTHER_FUSED.items()},
}


# --- running one -----------------------------------------------------------------------------------


def _bits(t) -> bytes:
    return t.detach().contiguous().view(-1).view(__import__("torch").uint8).cpu().numpy().tobytes()


def run_case(name: str, device: str, check: str | None) -> dict:
    """The case ``name`` on ``device`` (inside ``check_saved(check)`` when given): what it gave."""
    case = CASES[name]
    out: dict = {"case": name, "device": device}
    if device not in case.devices:
        return {**out, "outcome": "not run", "detail": f"{device.upper()}: the case exists on "
                                                       f"{', '.join(d.upper() for d in case.devices)} only"}
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            return {**out, "outcome": "not run", "detail": "no CUDA device"}
    block = None
    try:
        if check:
            import torchgen_patch

            block = torchgen_patch.check_saved(check)
            block.start()
        try:
            trial = case.make(device)
            before = _bits(trial.watched)
            trial.write()
            out["wrote"] = _bits(trial.watched) != before
            trial.loss().backward()
            out["outcome"] = "silent"
        finally:
            if block is not None:
                block.stop()
    except NotRun as e:
        return {**out, "outcome": "not run", "detail": str(e)}
    except Exception as e:  # noqa: BLE001 — what the case raised is what it gave
        text = str(e)
        out["outcome"] = "raises" if AUTOGRAD in text else "finding" if type(e).__name__ == "SavedTensorChanged" \
            else "error"
        out["detail"] = f"{type(e).__name__}: {text.strip().splitlines()[0] if text.strip() else ''}"[:400]
    if block is not None:
        out["findings"] = json.loads(block.to_json())
        out["checked"] = block.checked
    return out


def train(name: str, device: str) -> dict:
    """``TRAIN_STEPS`` steps of a small MLP with the optimizer of the case ``name``."""
    case = CASES[name]
    out: dict = {"case": name, "device": device}
    try:
        import torch

        if device == "cuda" and not torch.cuda.is_available():
            raise NotRun("no CUDA device")
        cls = optimizer_class(case.optimizer, device)
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)).to(device)
        opt = construct(cls, list(model.parameters()), device, lr=1e-2)
        x, y = torch.randn(32, 64, device=device), torch.randn(32, 1, device=device)
        losses = []
        for _ in range(TRAIN_STEPS):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        digest = hashlib.sha256()
        for p in model.parameters():
            digest.update(_bits(p))
        return {**out, "outcome": "trained", "losses": losses, "digest": digest.hexdigest(),
                "versions": [p._version for p in model.parameters()]}
    except NotRun as e:
        return {**out, "outcome": "not run", "detail": str(e)}
    except Exception as e:  # noqa: BLE001
        return {**out, "outcome": "error", "detail": f"{type(e).__name__}: {str(e).strip()[:400]}"}


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[0] not in ("case", "train") or argv[1] not in CASES:
        print(__doc__, file=sys.stderr)
        return 2
    what, name, device = argv[:3]
    check = argv[argv.index("--check") + 1] if "--check" in argv else None
    result = run_case(name, device, check) if what == "case" else train(name, device)
    print(MARK + json.dumps(result, sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
