"""What the saved-tensor check costs a training step, beside its floor: the same step (forward,
backward, AdamW) with the check off, with it on, and with the floor's two parts, side by side in
one process, interleaved round by round (the first mode alternating):

- **off**: no hooks;
- **on**: ``torchgen_patch.check_saved("warn")`` (the mode a training run leaves on), every step checked;
- **sampled**: the same check sampled at the default N (``every=torchgen_patch.saved.DEFAULT_EVERY``): each
  step timed alone and kept with whether it was drawn, so the same rounds give the cost of a step that
  is not drawn (no hooks on the stack: the draw at the end of each backward pass is what it costs) and
  the mean cost of all steps; beside them what the law expects, (1 - 1/N) x not drawn + 1/N x on;
- **identity hooks**: a pair of saved-tensor hooks in Python that keep and return each tensor as it
  is (what any saved-tensor hook costs);
- **two reads**: reading the step's saved bytes twice on the device, one pass each (as many bytes as
  the check's two fingerprints read), timed apart from the step.

On CUDA, with the native hooks, three probes say where the cost above the floor goes, measured in the
same rounds:

- **launches**: identity hooks that launch the check's own kernel on each tensor at save and at use
  (its reads and its launches, nothing else of the check);
- **synced**: identity hooks and one wait for the device at the end of each backward pass (the check
  reads its device comparisons there once);
- **per tensor**: the check with one launch a tensor at use (by default it reads all the tensors a
  backward node saved in one launch, when the node uses the first of them).

The floor is the identity-hooks step plus the two reads; a row's target is a ratio to the step
with the check off, and a row that misses it says by how much beside the floor. Peak memory: CUDA,
``torch.cuda.max_memory_allocated`` over one step (each mode reset before it); CPU, a fresh process
per mode, the steps' own peak resident size above the size before the first step.

    python bench/bench_saved.py [--device cpu|cuda] [--rounds N] [--models a,b] [--path native|python]
                                [--json PATH] [--report [FILE]]

``--report`` writes reports/saved-check-DEVICE-torch<version>.md (or FILE). CPU time on CPU (torch on
one thread, so it is the work done whatever else the machine runs), wall time on CUDA.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from common import ROOT, save  # noqa: E402

sys.path.insert(0, ROOT)

# name -> (what it is, target); the configurations are in build()
CPU_MODELS = {
    "gpt2": ("small GPT-2 (transformers; 768 wide, 12 heads, 2 layers, vocabulary 8192), batch 2 x 128 tokens", 1.10),
    "prenorm": ("pre-norm transformer (SDPA), 4 layers, 256 wide, 4 heads, batch 4 x 128 tokens", 1.10),
    "conv": ("conv net with batch norm, 8 convolutions of 32 channels, batch 8 x 3 x 32 x 32", 1.20),
    "mlp-deep": ("deep narrow MLP, 16 x Linear(256) + ReLU, batch 64", 1.30),
    "gpt2-ckpt": ("the small GPT-2, each block checkpointed (torch.utils.checkpoint, non-reentrant)", 1.20),
    "gpt2-ckpt-reentrant": ("the small GPT-2, each block checkpointed (reentrant)", 1.20),
    "prenorm-ckpt": ("the pre-norm transformer, each block checkpointed (non-reentrant)", 1.20),
}
CUDA_MODELS = {
    "gpt2-small": ("GPT-2 small (transformers: 12 layers, 768 wide, 12 heads, vocabulary 50257), 8 x 512 tokens, "
                   "fp32", 1.10),
    "gpt2-small-bf16": ("the same, bf16 autocast", 1.15),
    "prenorm-1024": ("12-layer 1024-wide pre-norm transformer (SDPA), 8 x 1024 tokens, fp32", 1.10),
    "prenorm-1024-bf16": ("the same, bf16 autocast", 1.15),
    "prenorm-2048-bf16": ("24 layers x 2048 wide, 4 x 2048 tokens, bf16 autocast", 1.15),
    "conv": ("20-conv 128-channel net with batch norm, 32 x 3 x 128 x 128", 1.10),
    "mlp": ("64 x Linear(256) MLP, batch 64", 1.30),
    "gpt2-small-ckpt": ("GPT-2 small fp32, each block checkpointed (torch.utils.checkpoint, non-reentrant)", 1.20),
    "gpt2-small-ckpt-reentrant": ("GPT-2 small fp32, each block checkpointed (reentrant)", 1.20),
    "prenorm-1024-ckpt": ("the 12-layer 1024-wide pre-norm transformer fp32, each block checkpointed "
                          "(non-reentrant)", 1.20),
}
# a checkpointed row: its name is its plain partner's and one of these (use_reentrant); its target, the
# partner's + CHECKPOINTED_MARGIN, is what the row's ratio is judged on beside the partner's too
CHECKPOINTED = {"-ckpt": False, "-ckpt-reentrant": True}
CHECKPOINTED_MARGIN = 0.10
MEMORY_TARGET = 0.01  # at most +1 % peak memory
SAMPLED_TARGET, NOT_DRAWN_TARGET = 1.01, 1.002  # the check sampled at the default N: its mean, a step not drawn
STEPS_PER_ROUND = {"mlp": 10, "mlp-deep": 10, "conv": 2, "prenorm": 2, "gpt2": 1}
GPT2 = {"gpt2": (2, 768, 12, 8192, 2, 128), "gpt2-small": (12, 768, 12, 50257, 8, 512),
        "gpt2-small-bf16": (12, 768, 12, 50257, 8, 512)}
PRENORM = {"prenorm": (4, 256, 4, 4, 128), "prenorm-1024": (12, 1024, 16, 8, 1024),
           "prenorm-1024-bf16": (12, 1024, 16, 8, 1024), "prenorm-2048-bf16": (24, 2048, 16, 4, 2048)}
CONV = {"conv": None}


class PreNorm:
    """A pre-norm transformer block stack (LayerNorm, SDPA attention, LayerNorm, GELU MLP), made on demand."""

    @staticmethod
    def make(layers: int, width: int, heads: int):
        import torch

        nn = torch.nn

        class Block(nn.Module):
            def __init__(self):
                super().__init__()
                self.n1, self.n2 = nn.LayerNorm(width), nn.LayerNorm(width)
                self.qkv, self.out = nn.Linear(width, 3 * width), nn.Linear(width, width)
                self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

            def forward(self, x):
                b, t, _ = x.shape
                q, k, v = self.qkv(self.n1(x)).view(b, t, 3, heads, width // heads).permute(2, 0, 3, 1, 4)
                a = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
                x = x + self.out(a.transpose(1, 2).reshape(b, t, width))
                return x + self.down(nn.functional.gelu(self.up(self.n2(x))))

        return nn.Sequential(*[Block() for _ in range(layers)], nn.LayerNorm(width))


def _conv_net(device: str, cuda: bool):
    import torch

    nn = torch.nn
    channels, depth, batch, size = (128, 20, 32, 128) if cuda else (32, 8, 8, 32)
    layers = [nn.Conv2d(3, channels, 3, padding=1), nn.BatchNorm2d(channels), nn.ReLU()]
    for _ in range(depth - 1):
        layers += [nn.Conv2d(channels, channels, 3, padding=1), nn.BatchNorm2d(channels), nn.ReLU()]
    model = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, 10)).to(device)
    x = torch.randn(batch, 3, size, size, device=device)
    y = torch.randint(0, 10, (batch,), device=device)
    return model, lambda: nn.functional.cross_entropy(model(x), y)


def plain_of(name: str) -> tuple[str, bool | None]:
    """(the plain partner's name, use_reentrant) of a checkpointed row; (name, None) of any other."""
    for suffix, reentrant in CHECKPOINTED.items():
        if name.endswith(suffix):
            return name[:-len(suffix)], reentrant
    return name, None


def _checkpoint_blocks(model, name: str, reentrant: bool):
    """``model`` with each of its transformer blocks run under ``torch.utils.checkpoint``."""
    import torch
    from torch.utils.checkpoint import checkpoint

    if name in GPT2:
        kwargs = {"use_reentrant": reentrant}
        enable = getattr(model, "activation_checkpointing_enable", None)  # transformers >= 5.x's name
        if enable is not None:
            enable(activation_checkpointing_kwargs=kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        return model.train()

    class Checkpointed(torch.nn.Module):
        def __init__(self, block):
            super().__init__()
            self.block = block

        def forward(self, x):
            return checkpoint(self.block, x, use_reentrant=reentrant)

    for i in range(len(model) - 1):  # the blocks, not the final norm
        model[i] = Checkpointed(model[i])
    return model


def build(name: str, device: str = "cpu"):
    """(model, the function that makes one step's loss) of ``name`` on ``device`` (a checkpointed row: its
    plain partner's model, each block checkpointed)."""
    name, reentrant = plain_of(name)
    model, loss_of = _build(name, device)
    return (model if reentrant is None else _checkpoint_blocks(model, name, reentrant)), loss_of


def _build(name: str, device: str):
    import torch

    torch.manual_seed(0)
    amp = name.endswith("-bf16")
    if name in GPT2:
        from transformers import GPT2Config, GPT2LMHeadModel
        from transformers.utils import logging

        logging.set_verbosity_error()
        layers, width, heads, vocab, batch, tokens = GPT2[name]
        model = GPT2LMHeadModel(GPT2Config(n_layer=layers, n_head=heads, n_embd=width, n_positions=tokens,
                                           vocab_size=vocab, bos_token_id=0, eos_token_id=0)).to(device)
        ids = torch.randint(0, vocab, (batch, tokens), device=device)
        inner = lambda: model(ids, labels=ids).loss  # noqa: E731
    elif name in PRENORM:
        layers, width, heads, batch, tokens = PRENORM[name]
        model = PreNorm.make(layers, width, heads).to(device)
        x = torch.randn(batch, tokens, width, device=device)
        inner = lambda: model(x).float().pow(2).mean()  # noqa: E731
    elif name == "conv":
        model, inner = _conv_net(device, device != "cpu")
    else:
        width, depth = (256, 64) if name == "mlp" else (256, 16)
        layers = []
        for _ in range(depth):
            layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
        model = torch.nn.Sequential(*layers).to(device)
        x = torch.randn(64, width, device=device)
        inner = lambda: model(x).pow(2).mean()  # noqa: E731

    def loss_of():
        with torch.autocast(device, dtype=torch.bfloat16, enabled=amp):
            return inner()

    return model, loss_of


def nothing_runs_when_off() -> dict:
    """With no check on: no saved-tensor hooks on the stack, saved_tensors_hooks' methods torch's own,
    no global optimizer hook."""
    import torch.autograd.graph as graph
    from torch.optim import optimizer

    from torchgen_patch.saved import compose, engine

    return {"hooks on the stack": engine.top(), "torch patched": compose.patched(),
            "saved_tensors_hooks.__enter__ from": graph.saved_tensors_hooks.__enter__.__module__,
            "global optimizer post-hooks": len(optimizer._global_optimizer_post_hooks)}


class Bench:
    """One model's step on one device, in the four modes of the module's docstring."""

    def __init__(self, name: str, device: str, path: str | None):
        import torch

        import torchgen_patch
        from torchgen_patch.saved import DEFAULT_EVERY

        self.name, self.device, self.torch = name, device, torch
        self.model, self.loss_of = build(name, device)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.check = torchgen_patch.check_saved("warn", path=path)
        self.every = DEFAULT_EVERY
        self.sampled = torchgen_patch.check_saved("warn", path=path, every=self.every)
        self.sampled_steps: list[tuple[float, bool]] = []  # (seconds, drawn) of each step in mode "sampled"
        self.sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
        self.clock = time.perf_counter if device == "cuda" else time.process_time
        self.n = STEPS_PER_ROUND.get(plain_of(name)[0], 1)

    def step(self, mode: str = "") -> None:
        self.opt.zero_grad(set_to_none=True)
        self.loss_of().backward()
        if mode == "synced":
            self.sync()
        self.opt.step()

    def probes(self) -> tuple[str, ...]:
        """The probe modes this run can measure: CUDA, with the native hooks (their kernel to launch)."""
        return ("launches", "synced", "per-tensor") if self.device == "cuda" and self.check.native is not None else ()

    def _launching(self, t):
        """An identity hook that launches the check's kernel on ``t`` (its fingerprint, left on the device)."""
        if t.is_cuda and t.numel():
            self.check.native.launch_cost(t, 1)
        return t

    def context(self, mode: str):
        import contextlib

        hooks = self.torch.autograd.graph.saved_tensors_hooks
        if mode == "on":
            return _running(self.check)
        if mode == "sampled":
            return _running(self.sampled)
        if mode == "per-tensor":
            return _running(self.check, batching=False)
        if mode in ("identity", "synced"):
            return hooks(lambda t: t, lambda t: t)
        if mode == "launches":
            return hooks(self._launching, self._launching)
        return contextlib.nullcontext()

    def block(self, mode: str) -> float:
        """Seconds per step of ``n`` steps in ``mode`` (the device synchronised at both ends)."""
        with self.context(mode):
            self.sync()
            if mode == "sampled":
                return self._steps_alone()
            t = self.clock()
            for _ in range(self.n):
                self.step(mode)
            self.sync()
            return (self.clock() - t) / self.n

    def _steps_alone(self) -> float:
        """Seconds per step of ``n`` steps with the sampled check, each timed alone and kept with whether it
        was drawn (the check's hooks on the stack as it began)."""
        total = 0.0
        for _ in range(self.n):
            drawn = self.sampled.sampler.laid
            t = self.clock()
            self.step()
            self.sync()
            seconds = self.clock() - t
            self.sampled_steps.append((seconds, drawn))
            total += seconds
        return total / self.n

    def saved_bytes(self) -> tuple[int, int]:
        """(saved tensors, their bytes) of one step: what each of the check's two reads reads."""
        seen = {"n": 0, "bytes": 0}

        def pack(t):
            seen["n"] += 1
            seen["bytes"] += t.numel() * t.element_size()
            return t

        with self.torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            self.step()
        return seen["n"], seen["bytes"]

    def two_reads(self, nbytes: int, repeats: int = 5) -> float:
        """Seconds to read ``nbytes`` twice on the device, one pass each (a sum of them as float32 words,
        the fastest read torch has on CPU and CUDA alike)."""
        torch = self.torch
        words = torch.zeros(max(nbytes // 4, 1), dtype=torch.float32, device=self.device)
        words.sum()
        times = []
        for _ in range(repeats):
            self.sync()
            t = self.clock()
            words.sum()
            words.sum()
            self.sync()
            times.append(self.clock() - t)
        del words
        return statistics.median(times)

    def peak(self, mode: str) -> float | None:
        """The step's peak allocated memory in MiB (CUDA; None elsewhere)."""
        if self.device != "cuda":
            return None
        torch = self.torch
        with self.context(mode):
            self.sync()
            torch.cuda.reset_peak_memory_stats()
            self.step()
            self.sync()
        return torch.cuda.max_memory_allocated() / 2**20


class _running:
    """The check on for a block (start and stop: its ``with`` form also prints its count); batching False:
    the native hooks launch one kernel a tensor at use."""

    def __init__(self, check, batching: bool = True):
        self.check, self.batching = check, batching

    def __enter__(self):
        from torchgen_patch.saved import native

        native.batching(self.batching)
        self.check.start()

    def __exit__(self, *exc):
        from torchgen_patch.saved import native

        self.check.stop()
        native.batching(True)


def timing(name: str, device: str, rounds: int, path: str | None, not_drawn_us: float) -> dict:
    """``not_drawn_us``: what a step not drawn costs the host (``not_drawn_cost``)."""
    b = Bench(name, device, path)
    modes = ("off", "on", "sampled", "identity") + b.probes()
    for mode in modes + modes:  # warm-up: kernels compiled, caches made, the check's key on the device
        b.block(mode)
    runs: dict[str, list] = {m: [] for m in modes}
    per_round: list[list[tuple[float, bool]]] = []  # the sampled check's steps, by round
    for r in range(rounds):
        order = modes if r % 2 == 0 else tuple(reversed(modes))
        for mode in order:
            first = len(b.sampled_steps)
            runs[mode].append(b.block(mode))
            if mode == "sampled":
                per_round.append(b.sampled_steps[first:])
    from torchgen_patch.saved import native

    launched, checked = {}, 0
    for mode in ("on",) + (("per-tensor",) if "per-tensor" in b.probes() else ()):
        before, checked_before = native.launches(), b.check.checked
        b.block(mode)
        launched[mode] = (native.launches() - before) // b.n
        if mode == "on":
            checked = (b.check.checked - checked_before) // b.n
    count, nbytes = b.saved_bytes()
    reads = b.two_reads(nbytes)
    peaks = {mode: b.peak(mode) for mode in ("off", "on", "identity")}
    off = statistics.median(runs["off"])
    ratios = [on / o for on, o in zip(runs["on"], runs["off"], strict=True)]
    hooks = [i / o for i, o in zip(runs["identity"], runs["off"], strict=True)]
    ratio = statistics.median(ratios)
    q = statistics.quantiles(ratios, n=4) if rounds >= 4 else [ratio, ratio, ratio]
    hooks_ratio = statistics.median(hooks)
    floor = hooks_ratio + reads / off
    probes = {m: statistics.median([p / o for p, o in zip(runs[m], runs["off"], strict=True)]) for m in b.probes()}
    what, target = (CUDA_MODELS if device == "cuda" else CPU_MODELS)[name]
    extra = None if peaks["off"] is None else peaks["on"] / peaks["off"] - 1
    return {**sampled_figures(runs, per_round, ratio, b.every, not_drawn_us),
            "model": name, "what": what, "target": target, "rounds": rounds, "path": b.check.path,
            "off_ms": off * 1e3, "on_ms": statistics.median(runs["on"]) * 1e3, "ratio": ratio, "p25": q[0],
            "p75": q[2], "probes": probes, "identity_ratio": hooks_ratio, "reads_ms": reads * 1e3, "floor": floor,
            "met": ratio <= target, "saved_tensors": count, "checked_per_step": checked, "saved_bytes": nbytes,
            "launches_per_step": launched,
            "peak_mib": peaks, "extra_peak": extra,
            "memory_met": None if extra is None else extra <= MEMORY_TARGET,
            "findings": len(b.check.findings), "threads": b.torch.get_num_threads()}


def sampled_figures(runs: dict, per_round: list, on: float, every: int, not_drawn_us: float) -> dict:
    """The sampled check's figures, from each round's "sampled" steps beside its "off" step: the mean of all
    those steps over the mean off step (``sampled_ratio``), and the median over rounds of the round's steps
    not drawn over its off step (``not_drawn_ratio``, p25-p75). A step not drawn differs from one with the
    check off by a few microseconds, far below the rounds' noise on a shared machine, so it is also given
    as the step off plus what it costs the host (``not_drawn_host``, from ``not_drawn_us``), which the
    target is judged on; and how many steps were drawn is luck, so beside the measured mean is what the law
    expects of it (``sampled_expected``): (1 - 1/N) x ``not_drawn_host`` + 1/N x ``on`` (every step checked)."""
    steps = [s for r in per_round for s in r]
    not_drawn = [statistics.mean(s for s, drawn in r if not drawn) / o
                 for r, o in zip(per_round, runs["off"], strict=True) if not all(drawn for _, drawn in r)]
    nd = statistics.median(not_drawn) if not_drawn else float("nan")  # (no round without a drawn step)
    q = statistics.quantiles(not_drawn, n=4) if len(not_drawn) >= 4 else [nd, nd, nd]
    host = 1 + not_drawn_us / 1e6 / statistics.median(runs["off"])
    expected = (1 - 1 / every) * host + on / every
    return {"every": every, "sampled_ratio": statistics.mean(s for s, _ in steps) / statistics.mean(runs["off"]),
            "sampled_steps": len(steps), "drawn_steps": sum(drawn for _, drawn in steps),
            "sampled_expected": expected, "not_drawn_ratio": nd, "not_drawn_p25": q[0], "not_drawn_p75": q[2],
            "not_drawn_us": not_drawn_us, "not_drawn_host": host,
            "sampled_met": expected <= SAMPLED_TARGET, "not_drawn_met": host <= NOT_DRAWN_TARGET}


def not_drawn_cost(path: str | None, n: int = 2000, repeats: int = 15) -> float:
    """What a step that is not drawn costs the host beyond no check, in microseconds: a tiny step (a product,
    its backward pass, an SGD step) with the check sampled at N = 2^40, so that no step is drawn (the draw at
    the end of each backward pass, no hooks), beside the same step without it; the least of ``repeats``
    blocks of ``n`` steps each, alternating."""
    import torch

    import torchgen_patch

    p = torch.nn.Parameter(torch.randn(4))
    opt = torch.optim.SGD([p], lr=0.1)
    never = torchgen_patch.check_saved("warn", path=path, every=2**40)

    def block(check) -> float:
        if check is not None:
            check.start()
        t = time.process_time()
        for _ in range(n):
            (p * 2).sum().backward()
            opt.step()
        seconds = time.process_time() - t
        if check is not None:
            check.stop()
        return seconds / n

    times: dict = {None: [], never: []}
    for _ in range(repeats):
        for check in times:
            times[check].append(block(check))
    return (min(times[never]) - min(times[None])) * 1e6


def hook_cost(device: str, path: str | None, ops: int = 1000, repeats: int = 5) -> dict:
    """What one saved tensor costs the host, in microseconds: a chain of ``ops`` products of tiny tensors
    (each saves both its inputs), forward and backward, with no hooks, identity hooks and the check;
    beside it, what one such op costs itself (forward and backward), for scale."""
    import contextlib

    import torch

    import torchgen_patch

    check = torchgen_patch.check_saved("warn", path=path)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    x = torch.randn(4, 4, device=device, requires_grad=True)
    w = torch.randn(4, 4, device=device, requires_grad=True)

    def chain():
        y = x
        for _ in range(ops):
            y = y * w
        y.sum().backward()

    def timed(ctx) -> float:
        times = []
        for _ in range(repeats):
            with ctx():
                sync()
                t = time.perf_counter()
                chain()
                sync()
                times.append(time.perf_counter() - t)
        return statistics.median(times)

    identity = lambda: torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t)  # noqa: E731
    chain()
    off, ident, on = timed(contextlib.nullcontext), timed(identity), timed(lambda: _running(check))
    saved = 2 * ops
    out = {"op_us": off / ops * 1e6, "identity_us": (ident - off) / saved * 1e6, "check_us": (on - off) / saved * 1e6}
    x, w = (torch.randn(0, 4, device=device, requires_grad=True) for _ in range(2))
    chain()  # tensors of no elements: the check's work without a fingerprint (nothing to read, no launch)
    off, on = timed(contextlib.nullcontext), timed(lambda: _running(check))
    out["bookkeeping_us"] = (on - off) / saved * 1e6
    return out


def kernel_bandwidth(check, device: str, nbytes: int = 1 << 30, repeats: int = 5) -> dict:
    """GB/s of one fingerprint of a tensor of ``nbytes`` by the check's own reading (the native kernel on
    CUDA, the C++ code on CPU), dense and with gaps (a third of each row: q of a fused qkv), float32 and
    bfloat16; beside it torch's sum of the same bytes."""
    import torch

    h = check.native
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    out = {}
    if h is None:
        return out
    for dtype in (torch.float32, torch.bfloat16):
        rows = nbytes // (3 * 1024 * dtype.itemsize)
        fused = torch.zeros(rows, 3 * 1024, dtype=dtype, device=device)
        for name, t in (("dense", fused), ("gaps", fused[:, :1024])):
            size = t.numel() * t.element_size()
            times = []
            for _ in range(repeats + 1):
                sync()
                start = time.perf_counter()
                h.fingerprint(t)
                sync()
                times.append(time.perf_counter() - start)
            out[f"{name} {str(dtype).replace('torch.', '')}"] = size / statistics.median(times[1:]) / 1e9
            if name == "gaps" and dtype == torch.bfloat16:
                heads = fused.view(rows, 3, 16, 64).permute(1, 2, 0, 3)[0]  # q of a fused qkv, heads first
                sync()
                start = time.perf_counter()
                h.fingerprint(heads)
                sync()
                out["heads bfloat16"] = heads.numel() * 2 / (time.perf_counter() - start) / 1e9
        sync()
        start = time.perf_counter()
        fused.sum()
        sync()
        out[f"torch's sum {str(dtype).replace('torch.', '')}"] = nbytes / (time.perf_counter() - start) / 1e9
        del fused
    if device == "cuda":
        out.update(launch_parts(h, torch))
    return out


def launch_parts(h, torch, n: int = 100, repeats: int = 15) -> dict:
    """Host microseconds of one launch of the check's kernel (a 64 KiB tensor), and of its parts: the
    driver's launch alone (``launch_driver_us``), the rest of the check's launch (``launch_rest_us``);
    beside them one small torch op (``torch_op_us``). Blocks of ``n`` from an idle device, so that the
    launch queue never fills (a full queue times the device, not the host); the median of ``repeats``."""
    small = torch.zeros(64, 256, device="cuda")
    h.fingerprint(small)

    def per(run) -> float:
        times = []
        for _ in range(repeats):
            torch.cuda.synchronize()
            times.append(run() / n * 1e6)
        return statistics.median(times)

    def torch_op() -> float:
        start = time.perf_counter()
        for _ in range(n):
            small.zero_()
        return time.perf_counter() - start

    parts = {key: per(lambda part=part: h.launch_cost(small, n, part))
             for key, part in (("launch_us", 0), ("launch_rest_us", 1), ("launch_driver_us", 2))}
    parts["torch_op_us"] = per(torch_op)
    torch.cuda.synchronize()
    return parts


MEMORY = r"""
import sys, json
sys.path.insert(0, sys.argv[1]); sys.path.insert(0, sys.argv[1] + "/bench")
import torch, torchgen_patch
torch.set_num_threads(1)
from bench_saved import build
name, mode, path = sys.argv[2], sys.argv[3], sys.argv[4] or None
model, loss_of = build(name)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
def step():
    opt.zero_grad(set_to_none=True); loss_of().backward(); opt.step()
def kb(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1])
check = torchgen_patch.check_saved("warn", path=path)
if mode == "on":
    check.start()
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # the peak resident size starts again from now: the model and optimizer built, no step yet
base = kb("VmRSS:")
for _ in range(3):
    step()
print(json.dumps({"base_kb": base, "peak_kb": kb("VmHWM:")}))
"""


def cpu_memory(name: str, path: str | None, repeats: int = 3) -> dict:
    """The steps' own peak resident size, off and on, each the best of ``repeats`` fresh processes."""
    out = {}
    for mode in ("off", "on"):
        runs = []
        for _ in range(repeats):
            r = subprocess.run([sys.executable, "-c", MEMORY, ROOT, name, mode, path or ""], capture_output=True,
                               text=True, env=dict(os.environ, PYTHONPATH=ROOT))
            if r.returncode:
                raise RuntimeError(r.stderr[-2000:])
            runs.append(json.loads(r.stdout.strip().splitlines()[-1]))
        best = min(runs, key=lambda m: m["peak_kb"])
        out[mode] = (best["peak_kb"] - best["base_kb"]) / 1024
    out["extra"] = out["on"] / max(out["off"], 1e-9) - 1
    return out


def main(rounds: int = 11, report=False, json_path: str | None = None, device: str = "cpu",
         models: list[str] | None = None, path: str | None = None) -> dict:
    """``report``: True for reports/saved-check-DEVICE-torch<version>.md, or a path."""
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: --device cuda: no CUDA device")
    table = CUDA_MODELS if device == "cuda" else CPU_MODELS
    unknown = sorted(set(models or ()) - set(table))
    if unknown:
        raise SystemExit(f"error: unknown model(s) for {device}: {', '.join(unknown)} (known: {', '.join(table)})")
    threads = torch.get_num_threads()
    if device == "cpu":
        torch.set_num_threads(1)  # CPU time is then the work done, whatever else the machine runs
    try:
        results = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "torch": torch.__version__,
                   "python": platform.python_version(),
                   "off": nothing_runs_when_off(), "models": []}
        print(f"with the check off: {results['off']}", flush=True)
        results["hook_cost"] = hook_cost(device, path)
        print("per saved tensor on the host: {identity_us:.2f} us with identity hooks, {check_us:.2f} us with the "
              "check; one op of the chain (forward and backward) {op_us:.1f} us".format(**results["hook_cost"]),
              flush=True)
        results["not_drawn_us"] = not_drawn_cost(path)
        print(f"a step not drawn (the check sampled): {results['not_drawn_us']:.2f} us on the host beyond no check",
              flush=True)
        import torchgen_patch

        results["bandwidth"] = kernel_bandwidth(torchgen_patch.check_saved("warn", path=path), device)
        print("one fingerprint: " + ", ".join(f"{k} {v:.1f}" for k, v in results["bandwidth"].items()), flush=True)
        for name in models or table:
            t = timing(name, device, rounds, path, results["not_drawn_us"])
            if device == "cpu":
                m = cpu_memory(name, path)
                t["cpu_memory"] = m  # reported: the +1 % target is the GPU's, where memory decides the batch size
                t["extra_peak"], t["memory_met"] = m["extra"], None
            results["models"].append(t)
            print(summary_line(t), flush=True)
            if json_path:  # after every model: a run cut short keeps what it measured (--from-json renders it)
                save([results], json_path)
    finally:
        torch.set_num_threads(threads)
    if json_path:
        save([results], json_path)
    if report:
        _write_report(report, device, render(results, rounds, device), results["torch"])
    return results


def _verdict(t: dict) -> str:
    if t["met"]:
        return f"<= {t['target']}: met"
    return (f"<= {t['target']}: **not met** by {t['ratio'] - t['target']:.3f} (the floor is {t['floor']:.3f}: "
            f"{max(t['ratio'] - t['floor'], 0):.3f} above it)")


def _memory(t: dict) -> str:
    if t.get("cpu_memory"):
        m = t["cpu_memory"]
        text = f"{m['off']:.1f} / {m['on']:.1f} MiB"
    elif t["peak_mib"]["off"] is not None:
        text = f"{t['peak_mib']['off']:.0f} / {t['peak_mib']['on']:.0f} MiB"
    else:
        return "not measured"
    if t["memory_met"] is None:
        return f"{text} ({t['extra_peak']:+.1%})"
    ok = "met" if t["memory_met"] else "**not met**"
    return f"{text} ({t['extra_peak']:+.1%}; <= +1 %: {ok})"


def _sampled(t: dict) -> str:
    """The sampled check's cell: its measured mean, what the law expects of it, and their target."""
    ok = "met" if t["sampled_met"] else "**not met**"
    return (f"{t['sampled_ratio']:.3f} ({t['drawn_steps']} of {t['sampled_steps']} steps drawn); expected "
            f"{t['sampled_expected']:.3f}: <= {SAMPLED_TARGET}: {ok}")


def _not_drawn(t: dict) -> str:
    ok = "met" if t["not_drawn_met"] else "**not met**"
    return (f"{t['not_drawn_host']:.4f} (+{t['not_drawn_us']:.1f} us a step): <= {NOT_DRAWN_TARGET}: {ok}; in the "
            f"rounds {t['not_drawn_ratio']:.3f} ({t['not_drawn_p25']:.3f}-{t['not_drawn_p75']:.3f})")


def summary_line(t: dict) -> str:
    return (f"{t['model']}: off {t['off_ms']:.2f} ms, on {t['on_ms']:.2f} ms, ratio {t['ratio']:.3f} "
            f"(p25-p75 {t['p25']:.3f}-{t['p75']:.3f}) [{_verdict(t).replace('**', '')}]; sampled at N = "
            f"{t['every']}: {_sampled(t).replace('**', '')}; a step not drawn {_not_drawn(t).replace('**', '')}; "
            f"floor {t['floor']:.3f} "
            f"(identity hooks {t['identity_ratio']:.3f} + two reads {t['reads_ms']:.2f} ms); "
            f"{t['saved_tensors']} saved tensors, {t['saved_bytes'] / 2**20:.0f} MiB a step; peak "
            f"{_memory(t).replace('**', '')}; path {t['path']}; findings {t['findings']}")


def _write_report(report, device: str, text: str, release: str) -> None:
    """``release``: the torch the run measured (its version, as the run's results name it)."""
    path = report if isinstance(report, str) else os.path.join(
        ROOT, "reports", f"saved-check-{device}-torch{release.split('+')[0]}.md")
    with open(path, "w") as f:
        f.write(text)
    print(f"wrote {os.path.relpath(path, ROOT) if path.startswith(ROOT) else path}")


def _where_it_goes(results: dict) -> list[str]:
    """What lies between each row's floor and its ratio, from the run's own probes: the check's host work
    per saved tensor beyond identity hooks (``hook_cost``) times the step's saved tensors; where the
    device's launches were measured, what the driver's launch alone adds to the floor, once a tensor at save
    and once at use (the least a check that launches once a tensor at each end can cost), and for the
    launches the check made in the step (one a tensor at save, one a backward node at use; the floor reads the
    step's saved bytes in two launches in all)."""
    cost = results.get("hook_cost")
    if not cost:
        return []
    per = cost["check_us"] - cost["identity_us"]
    parts = results.get("bandwidth") or {}
    launch, driver = parts.get("launch_us"), parts.get("launch_driver_us")
    text = f"The check's host work per saved tensor beyond identity hooks is {per:.2f} us (the chain above)"
    if "bookkeeping_us" in cost:
        text += (f"; with tensors of no elements (no fingerprint, no launch) it costs {cost['bookkeeping_us']:.2f} us "
                 "beyond no hooks")
    if launch and driver:
        text += (f". One launch of its kernel costs the host {launch:.2f} us, of which the driver's launch alone is "
                 f"{driver:.2f} us and the rest of the check's launch {parts['launch_rest_us']:.2f} us (one small "
                 f"torch op: {parts['torch_op_us']:.2f} us)")
    text += (". Where the host runs behind the device (short kernels: bf16, small layers), that work adds to the "
             "step; the floor has no term for it. At use the check reads all the tensors a backward node saved in one "
             "launch (they are used one after another, before the node computes anything); at save it launches once "
             "a tensor, since a read put off until later could miss a write made between the op that saved a tensor "
             "and that read.")
    extra = driver is not None
    probed = all(t.get("probes") for t in results["models"])
    if probed:
        text += (" The probes (measured in the same rounds): identity hooks that launch the check's kernel at save "
                 "and at use (its reads and its launches, nothing else of it), and identity hooks with one wait for "
                 "the device at the end of each backward pass (what `raise` pays there; `warn` does not wait); what "
                 "is left above the first probe is the check's own work on the host (its bookkeeping, frames, the "
                 "comparisons kept for later), less what reading a node's saved tensors in one launch at use "
                 "saves; and the check itself with one launch a tensor at use.")
    head = ["model", "ratio", "floor", "+ host work (saved x per tensor)", "predicted"]
    per_tensor = probed and all("per-tensor" in t["probes"] for t in results["models"])
    if probed:
        head += ["identity hooks + the check's launches", "the rest", "a wait at backward's end (raise)"]
    if per_tensor:
        head += ["the check, one launch a tensor at use"]
    if extra:
        head += ["floor + one driver launch at save and one at use"]
    counted = extra and all(t.get("launches_per_step") for t in results["models"])
    if counted:
        head += ["launches a step (saved tensors)", "floor + the check's launches"]
    out = ["", "## Where the cost above the floor goes", "", text, "",
           "| " + " | ".join(head + ["target"]) + " |", "|" + "---|" * (len(head) + 1)]
    for t in results["models"]:
        host = t["saved_tensors"] * per / 1e3 / t["off_ms"]
        row = [f"{t['model']}", f"{t['ratio']:.3f}", f"{t['floor']:.3f}", f"+{host:.3f}", f"{t['floor'] + host:.3f}"]
        if probed:
            p = t["probes"]
            wait = p["synced"] - t["identity_ratio"]
            row += [f"{p['launches']:.3f}", f"{t['ratio'] - p['launches']:+.3f}", f"{wait:+.3f}"]
        if per_tensor:
            row.append(f"{t['probes']['per-tensor']:.3f}")
        if extra:
            row.append(f"{t['floor'] + t['saved_tensors'] * 2 * driver / 1e3 / t['off_ms']:.3f}")
        if counted:
            n = t["launches_per_step"]["on"]
            row += [f"{n} ({t['saved_tensors']})", f"{t['floor'] + n * driver / 1e3 / t['off_ms']:.3f}"]
        out.append("| " + " | ".join(row + [f"{t['target']} ({'met' if t['met'] else 'not met'})"]) + " |")
    return out


def render(results: dict, rounds: int, device: str) -> str:
    clock = "wall time (the device synchronised at both ends of each block of steps)" if device == "cuda" else \
        "CPU time (torch on one thread: the work done)"
    lines = [f"# The saved-tensor check's cost: a training step with the check on / off, and its floor, "
             f"{device.upper()}",
             "", f"- {results['device']}, torch `{results['torch']}`, "
             f"Python {results.get('python', platform.python_version())}"
             + (f", {os.cpu_count()} CPU cores" if device == "cpu" else ""),
             f"- command: `python bench/bench_saved.py --device {device} --rounds {rounds} --report`",
             f"- each figure: the median of {rounds} per-round ratios of one step's {clock} (forward, backward, "
             "AdamW step) to the step with the check off, every mode in one process, interleaved, the order "
             "alternating; the check in `warn` mode",
             "- sampled: the same check sampled at the default N (each step checked with probability 1/N), each of "
             "its steps timed alone: the mean of them all (how many were drawn is luck; expected: (1 - 1/N) x a step "
             "not drawn + 1/N x on, from the figures of the same rounds), and a step that was not drawn, whose "
             "stack holds no saved-tensor hooks (what it costs is the draw at the end of each backward pass): "
             "the median of its ratio over the rounds, and, since a few microseconds lie far below the rounds' "
             "noise, the step off plus what such a step costs the host, measured apart (a tiny step, a product, its "
             "backward pass and an SGD step, with the check sampled so that no step is drawn, beside none: "
             f"{results.get('not_drawn_us', float('nan')):.2f} us), on which the target is judged",
             "- floor: the step under an identity pair of saved-tensor hooks in Python, plus two reads of the "
             "step's saved bytes on the device (one pass each, timed apart); what any check of saved tensors "
             "that reads them twice costs at least",
             "- peak: " + ("`torch.cuda.max_memory_allocated` over one step" if device == "cuda" else
                           "a fresh process per mode, the peak resident size of three steps above the size before "
                           "the first (best of 3)"),
             "- with the check off: " + ", ".join(f"{k}: `{v}`" for k, v in results["off"].items()),
             "- what one saved tensor costs the host (a chain of 1,000 products of 4 x 4 tensors, forward and "
             "backward, each saving both inputs): {identity_us:.2f} us with identity hooks, {check_us:.2f} us with "
             "the check; one op of that chain costs {op_us:.1f} us itself".format(**results["hook_cost"]), "",
             "| model | saved a step | off | on | on / off (p25-p75) | target | sampled at the default N, mean "
             "(expected) | a step not drawn: off + its host cost (the rounds: median, p25-p75) | floor (identity "
             "hooks + two reads) | peak off / on | findings |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for t in results["models"]:
        lines.append(
            f"| {t['what']} | {t['saved_tensors']}, {t['saved_bytes'] / 2**20:.0f} MiB | {t['off_ms']:.2f} ms | "
            f"{t['on_ms']:.2f} ms | **{t['ratio']:.3f}** ({t['p25']:.3f}-{t['p75']:.3f}) | {_verdict(t)} | "
            f"N = {t['every']}: {_sampled(t)} | {_not_drawn(t)} | "
            f"{t['floor']:.3f} ({t['identity_ratio']:.3f} + {t['reads_ms']:.2f} ms) | {_memory(t)} | "
            f"{t['findings']} |")
    paths = sorted({t["path"] for t in results["models"]})
    lines += ["", f"The check ran on its {' and '.join(paths)} path."]
    lines += _checkpointed_rows(results)
    lines += _where_it_goes(results)
    return "\n".join(lines) + "\n"


def _checkpointed_rows(results: dict) -> list[str]:
    """Each checkpointed row beside its plain partner's, where both ran: the check's ratio on each and their
    difference, judged on CHECKPOINTED_MARGIN."""
    rows = {t["model"]: t for t in results["models"]}
    pairs = [(t, rows[plain_of(name)[0]]) for name, t in rows.items()
             if plain_of(name)[1] is not None and plain_of(name)[0] in rows]
    if not pairs:
        return []
    out = ["", "## Checkpointed rows beside their plain ones", "",
           "Each block run under `torch.utils.checkpoint`: what a reentrant checkpoint's recomputation saves inside "
           "backward is used by that pass alone, and is counted as not read (its version is checked); what the "
           "forward saves under non-reentrant checkpointing's own hooks is read and compared, with what backward "
           "recomputes where the original is gone.", "",
           "| checkpointed | on / off | plain | on / off | difference | target |", "|---|---|---|---|---|---|"]
    for t, plain in pairs:
        diff = t["ratio"] - plain["ratio"]
        ok = "met" if diff <= CHECKPOINTED_MARGIN else "**not met**"
        out.append(f"| {t['model']} | {t['ratio']:.3f} | {plain['model']} | {plain['ratio']:.3f} | {diff:+.3f} | "
                   f"<= +{CHECKPOINTED_MARGIN:.2f}: {ok} |")
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--models", help="a comma-separated subset of the device's models")
    ap.add_argument("--path", choices=("native", "python"), help="the check's path (default: native where built)")
    ap.add_argument("--json")
    ap.add_argument("--report", nargs="?", const=True, default=False, metavar="FILE")
    ap.add_argument("--from-json", metavar="FILE", help="write --report from a run's --json instead of measuring")
    a = ap.parse_args()
    if a.from_json:
        with open(a.from_json) as fh:
            saved = json.load(fh)[0]
        device = "cpu" if saved["device"] == "cpu" else "cuda"  # the run's, whatever this machine has
        _write_report(a.report or True, device, render(saved, saved["models"][0]["rounds"], device), saved["torch"])
        raise SystemExit(0)
    main(a.rounds, a.report, a.json, a.device, a.models.split(",") if a.models else None, a.path)
