"""The compatibility battery's scenarios, run in one fresh process:

    python tests/compat_scenarios.py DEVICE PATCHED(0|1) [BACKEND]

prints one JSON object: scenario -> {"value": ..., "versions": {...}} or
{"raises": "Type: first line", "versions": {...}}. ``value`` is everything the
scenario computed (tensors as nested lists, graphs as their code); ``versions``
the version counters it read. tests/test_compat.py runs it unpatched and
patched and compares.
"""

from __future__ import annotations

import json
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
from fsdp2_two_ranks import train  # noqa: E402  (one training loop for both)
SCENARIOS = {}


def scenario(fn):
    SCENARIOS[fn.__name__] = fn
    return fn


def val(x):
    """A JSON value for results: tensors as (dtype, shape, values), recursively."""
    if isinstance(x, torch.Tensor):
        if x.device.type == "meta" or type(x).__name__ == "FakeTensor":
            return ["tensor", str(x.dtype), list(x.shape)]
        if hasattr(x, "full_tensor"):
            x = x.full_tensor()
        return ["tensor", str(x.dtype), list(x.shape), x.detach().cpu().float().tolist()]
    if isinstance(x, (list, tuple)):
        return [val(v) for v in x]
    if isinstance(x, dict):
        return {k: val(v) for k, v in sorted(x.items())}
    if isinstance(x, float):
        return repr(x)
    return x


def graph_code(gm) -> str:
    return "\n".join(line.rstrip() for line in gm.code.strip().splitlines())


def inputs(device, n=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.rand(2, 2, generator=g).to(device) + 0.5 for _ in range(n)]


def split_out(x, y, z):
    torch.split_with_sizes_copy(x, [1, 1], dim=1, out=[y, z])
    return y + z


def foreach_inplace(xs, ys):
    torch._foreach_add_(xs, ys)
    torch._foreach_mul_(xs, 2.0)
    torch._foreach_lerp_(xs, ys, 0.5)
    return [x * 1 for x in xs]


def versions(**named):
    return {k: (int(t._version) if not isinstance(t, (list, tuple)) else [int(x._version) for x in t])
            for k, t in named.items()}


@scenario
def compile_out_tensor_list(device):
    x, = inputs(device, 1)
    y, z = torch.empty(2, 1, device=device), torch.empty(2, 1, device=device)
    r = torch.compile(split_out, backend="inductor", fullgraph=False)(x, y, z)
    return [r, y, z], versions(y=y, z=z)


@scenario
def compile_foreach_inplace(device):
    xs, ys = inputs(device), inputs(device, seed=1)
    r = torch.compile(foreach_inplace, backend="inductor")(xs, ys)
    return [r, xs], versions(xs=xs)


def _model(device, seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2)).to(device)


def _compiled_step(device, mode):
    m = _model(device)
    opt = torch.optim.AdamW(m.parameters(), lr=0.01, **{mode: True})
    x = torch.randn(16, 4, device=device)
    step = torch.compile(opt.step)
    for _ in range(2):
        opt.zero_grad()
        m(x).pow(2).mean().backward()
        step()
    return list(m.parameters()), versions(params=list(m.parameters()))


@scenario
def compiled_optimizer_step_fused(device):
    return _compiled_step(device, "fused")


@scenario
def compiled_optimizer_step_foreach(device):
    return _compiled_step(device, "foreach")


@scenario
def compiled_model_trained_with_fused_adamw(device):
    m = _model(device)
    cm = torch.compile(m)
    opt = torch.optim.AdamW(m.parameters(), lr=0.01, fused=True)
    x, y = torch.randn(16, 4, device=device), torch.randn(16, 2, device=device)
    return train(m, opt, x, y, 3, forward=cm), versions(params=list(m.parameters()))


@scenario
def fake_tensor_mode(device):
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        xs, ys = [torch.empty(3, device=device) for _ in range(2)], [torch.empty(3, device=device) for _ in range(2)]
        torch._foreach_add_(xs, ys)
        x = torch.empty(2, 2, device=device)
        y, z = torch.empty(2, 1, device=device), torch.empty(2, 1, device=device)
        torch.split_with_sizes_copy(x, [1, 1], dim=1, out=[y, z])
        return [xs, y, z], versions(xs=xs, y=y, z=z)


@scenario
def meta_tensors(device):
    xs, ys = [torch.empty(3, device="meta") for _ in range(2)], [torch.empty(3, device="meta") for _ in range(2)]
    torch._foreach_add_(xs, ys)
    x = torch.empty(2, 2, device="meta")
    y, z = torch.empty(0, device="meta"), torch.empty(0, device="meta")
    torch.split_with_sizes_copy(x, [1, 1], dim=1, out=[y, z])
    return [xs, y, z], versions(xs=xs, y=y, z=z)


def _mutating(x):
    xs = [x.clone(), x.clone() * 2]
    torch._foreach_add_(xs, [x, x])
    y, z = torch.empty(2, 1, device=x.device), torch.empty(2, 1, device=x.device)
    torch.split_with_sizes_copy(xs[0], [1, 1], dim=1, out=[y, z])
    return xs[1] + y * z


@scenario
def functionalize(device):
    from torch.fx.experimental.proxy_tensor import make_fx

    x, = inputs(device, 1)
    f = torch.func.functionalize(_mutating)
    return [f(x), graph_code(make_fx(f)(x))], {}


@scenario
def make_fx_trace(device):
    from torch.fx.experimental.proxy_tensor import make_fx

    x, = inputs(device, 1)
    return graph_code(make_fx(_mutating)(x)), {}


@scenario
def aot_function(device):
    from functorch.compile import aot_function as aot

    graphs = []

    def compiler(gm, _):
        graphs.append(graph_code(gm))
        return gm

    x, = inputs(device, 1)
    x.requires_grad_()
    out = aot(lambda t: _mutating(t).sin(), fw_compiler=compiler, bw_compiler=compiler)(x)
    out.sum().backward()
    return [out, x.grad, graphs], {}


@scenario
def vmap(device):
    def f(x):
        xs = [x.clone(), x.clone()]
        torch._foreach_mul_(xs, 3.0)
        return xs[0] + xs[1]

    x = torch.arange(6.0, device=device).reshape(3, 2)
    return torch.vmap(f)(x), {}


@scenario
def inference_mode(device):
    with torch.inference_mode():
        xs, ys = inputs(device), inputs(device, seed=1)
        torch._foreach_add_(xs, ys)
        y, z = torch.empty(2, 1, device=device), torch.empty(2, 1, device=device)
        torch.split_with_sizes_copy(xs[0], [1, 1], dim=1, out=[y, z])
    return [xs, y, z], {"inference": [t.is_inference() for t in xs + [y, z]]}


@scenario
def out_with_requires_grad_input(device):
    """An out= op that returns nothing, given an input that requires grad in grad mode: unpatched it
    writes its outputs, which do not require grad (the gradient is lost); patched it refuses, as
    add(out=) does."""
    x, = inputs(device, 1)
    x.requires_grad_()
    y, z = torch.empty(2, 1, device=device), torch.empty(2, 1, device=device)
    torch.split_with_sizes_copy(x, [1, 1], dim=1, out=[y, z])
    return [y, z, y.requires_grad or z.requires_grad], versions(y=y, z=z)


@scenario
def inference_tensor_written_outside_inference_mode(device):
    with torch.inference_mode():
        xs, ys = inputs(device), inputs(device, seed=1)
    torch._foreach_add_(xs, ys)
    return xs, {}


@scenario
def autocast(device):
    a, b = inputs(device)
    with torch.autocast(device, dtype=torch.bfloat16):
        c = a @ b
        cs = [c.clone(), c.clone()]
        torch._foreach_add_(cs, [c, c])
    return [c, cs], versions(cs=cs)


@scenario
def jit_trace(device):
    x, = inputs(device, 1)
    traced = torch.jit.trace(_mutating, (x,), check_trace=False)
    return [traced(x), str(traced.graph).count("aten::")], {}


@scenario
def checkpoint_non_reentrant(device):
    from torch.utils.checkpoint import checkpoint

    x, = inputs(device, 1)
    w = torch.nn.Parameter(torch.rand(2, 2, device=device))

    def block(t):
        ys = [t @ w, t * w]
        torch._foreach_mul_(ys, 2.0)
        return (ys[0] + ys[1]).sin()

    out = checkpoint(block, x, use_reentrant=False)
    out.sum().backward()
    return [out, w.grad], {}


@scenario
def views_of_one_base(device):
    base = torch.zeros(2, 2, device=device)
    v0, v1 = base[0], base[1]
    torch._foreach_add_([v0, v1], 1.0)
    return base, versions(base=base, v0=v0, v1=v1)


@scenario
def dtensor(device):
    from torchgen_patch.checks.subclass import dtensor_api

    Replicate, Shard, distribute_tensor = dtensor_api().Replicate, dtensor_api().Shard, dtensor_api().distribute_tensor

    from torchgen_patch.checks.subclass import one_rank_mesh

    with one_rank_mesh(device) as mesh:
        xs = [distribute_tensor(t, mesh, [Shard(0)]) for t in inputs(device)]
        ys = [distribute_tensor(t, mesh, [Replicate()]) for t in inputs(device, seed=1)]
        torch._foreach_add_(xs, ys)
        m = _model(device)
        opt = torch.optim.AdamW([torch.nn.Parameter(distribute_tensor(p.detach(), mesh, [Replicate()]))
                                 for p in m.parameters()], lr=0.01, foreach=True)
        for p in opt.param_groups[0]["params"]:
            p.grad = torch.ones_like(p)
        opt.step()
        return [xs, opt.param_groups[0]["params"]], versions(xs=xs)


def main():
    device, patched = sys.argv[1], sys.argv[2] == "1"
    backend = sys.argv[3] if len(sys.argv) > 3 else "cpp"
    torch.manual_seed(0)
    sys.path.insert(0, ROOT)
    if patched:
        import torchgen_patch

        rep = torchgen_patch.install(backend=backend)
        assert not rep.refused, rep.summary()
    out = {}
    only = os.environ.get("COMPAT_ONLY", "")
    check = os.environ.get("COMPAT_CHECK_SAVED")  # the saved-tensor check on, in this mode, around each scenario
    for name, fn in SCENARIOS.items():
        if only and name not in only.split(","):
            continue
        torch.manual_seed(0)
        torch._dynamo.reset()  # each scenario compiles from scratch, whatever ran before it
        saved = None
        try:
            if check:
                import torchgen_patch

                with torchgen_patch.check_saved(check) as saved:
                    value, vers = fn(device)
            else:
                value, vers = fn(device)
            out[name] = {"value": val(value), "versions": vers}
        except Exception as e:  # noqa: BLE001 — any failure of a scenario is its row of the table
            first = next((line for line in str(e).splitlines() if line.strip()), "")
            out[name] = {"raises": f"{type(e).__name__}: {first.strip()}", "versions": {}}
        if saved is not None:
            out[name]["saved"] = {"findings": len(saved.findings), "checked": saved.checked}
    print(json.dumps(out, sort_keys=True))


if __name__ == "__main__":
    main()
