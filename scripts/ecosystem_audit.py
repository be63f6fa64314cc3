"""Audit extension libraries for mutating custom ops without an ADInplaceOrView kernel,
and measure the consequence where a check exists, unpatched and patched.

    python scripts/ecosystem_audit.py [--site DIR] > reports/ecosystem-audit-torch2.13.md

Each library is audited in a fresh interpreter (so one library's ops never show up under
another's). --site: an extra directory to import libraries from (libraries that are not in
the development setup were installed there with `pip install --no-deps --target DIR`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# distribution, modules to import, check
LIBS = [
    ("bitsandbytes", ["bitsandbytes"], "bnb"),
    ("fbgemm-gpu-cpu", ["fbgemm_gpu", "fbgemm_gpu.split_table_batched_embeddings_ops_training"], "fbgemm"),
    ("torchao", ["torchao", "torchao.optim"], "torchao"),
    ("torch-optimi", ["optimi"], "optimi"),
    ("liger-kernel", ["liger_kernel", "liger_kernel.ops"], None),
    # optimizers that write outside the dispatcher (the shipped overlay's optimizer entries)
    ("deepspeed", ["deepspeed.ops.adam", "deepspeed.ops.adagrad", "deepspeed.ops.lion"], "deepspeed"),
]


def _stale_optimizer(make):
    """Save a parameter for backward, step, backward: 'raises' or 'silent (version v)'."""
    import torch

    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(64, 64))
    opt = make([p])
    loss = (p * p).sum()
    p.grad = torch.ones_like(p)
    opt.step()
    try:
        loss.backward()
    except RuntimeError as e:
        return f"raises (version {p._version})" if "modified by an inplace operation" in str(e) else \
            f"error: {str(e)[:80]}"
    return f"silent (version {p._version})"


def _checks(kind: str) -> dict[str, str]:
    import warnings

    warnings.filterwarnings("ignore")
    if kind == "bnb":
        from testbed.ecosystem import bnb_optimizer, bnb_optimizers

        return {f"bnb.optim.{n}: step between forward and backward": _stale_optimizer(
            lambda ps, n=n: bnb_optimizer(n, ps)) for n in bnb_optimizers()}
    if kind == "fbgemm":
        from testbed.ecosystem import FUSED, embedding_then_lookup, stale_lookup

        out = {}
        for optim in FUSED:
            tbe, w, penalty = stale_lookup(optim)
            try:
                penalty.backward()
                out[f"CPU TBE, fused {optim}: penalty on the table, lookup + backward, penalty backward"] = \
                    f"silent (weights version {w._version})"
            except RuntimeError:
                out[f"CPU TBE, fused {optim}: penalty on the table, lookup + backward, penalty backward"] = "raises"
        try:
            embedding_then_lookup()
            out["ids shared with F.embedding, then an fbgemm lookup"] = "runs"
        except RuntimeError:
            out["ids shared with F.embedding, then an fbgemm lookup"] = "raises (ids bumped by bounds_check_indices)"
        return out
    if kind == "torchao":
        import torchao.optim as o

        return {"torchao.optim.AdamW8bit (control: aten ops)": _stale_optimizer(lambda ps: o.AdamW8bit(ps, lr=0.05))}
    if kind == "optimi":
        import optimi

        return {"optimi.AdamW (control: aten ops)": _stale_optimizer(lambda ps: optimi.AdamW(ps, lr=0.05))}
    if kind == "deepspeed":
        from deepspeed.ops.adagrad import DeepSpeedCPUAdagrad
        from deepspeed.ops.adam import DeepSpeedCPUAdam, FusedAdam
        from deepspeed.ops.lion import DeepSpeedCPULion

        return {f"{name}: step between forward and backward": _stale_optimizer(make) for name, make in (
            ("DeepSpeedCPUAdam (adamw_mode=True)", lambda ps: DeepSpeedCPUAdam(ps)),
            ("DeepSpeedCPUAdam (adamw_mode=False)", lambda ps: DeepSpeedCPUAdam(ps, adamw_mode=False)),
            ("DeepSpeedCPUAdagrad", DeepSpeedCPUAdagrad), ("DeepSpeedCPULion", DeepSpeedCPULion),
            ("FusedAdam (its CPU build)", FusedAdam))}
    return {}


def worker(dist: str) -> dict:
    """In a fresh interpreter: import the library, find its ops, run its check before/after."""
    import importlib.metadata

    import torch

    import torchgen_patch
    from torchgen_patch.runtime import dispatcher, registry

    _, modules, check = next(x for x in LIBS if x[0] == dist)
    before = set(dispatcher.all_op_names())
    out = {"dist": dist, "version": None, "imported": [], "import_errors": {}, "ops": [], "checks": {}}
    try:
        out["version"] = importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        out["import_errors"][dist] = "not installed"
        return out
    for m in modules:
        try:
            registry.import_modules([m])
            out["imported"].append(m)
        except Exception as e:  # noqa: BLE001 — reported, and the other modules still audited
            out["import_errors"][m] = getattr(e, "message", str(e))
    # the library's own operators: defined in its files, or (C++ ops registered where this machine
    # cannot see) in a namespace named after it; importing it also registers torch's own lazily
    top = modules[0]
    lib_dir = os.path.dirname(os.path.abspath(sys.modules[top].__file__)) + os.sep if top in sys.modules else None
    mine = set()
    for name in set(dispatcher.all_op_names()) - before:
        ns = name.split("::", 1)[0]
        loc = registry.location_of(name)
        if (loc.path and lib_dir and os.path.abspath(loc.path).startswith(lib_dir)) or \
                (loc.path is None and top.startswith(ns)):
            mine.add(name)
    out["namespaces"] = sorted({n.split("::", 1)[0] for n in mine})
    ops = [o for o in registry.uncovered(out["namespaces"]) if o.name in mine] if mine else []
    out["ops"] = [{"name": o.name, "schema": o.schema, "written": list(o.written),
                   "location": o.loc.render() if o.loc.path else None} for o in ops]
    out["torch"] = torch.__version__
    out["optimizers"] = _probes(out["imported"])
    if check:
        out["checks"]["unpatched"] = _checks(check)
        if any(p["entry"] for p in out["optimizers"]):  # the shipped overlay's optimizer entries alone
            torchgen_patch.install(runtime_ops=[])
            try:
                out["checks"]["entries"] = _checks(check)
            finally:
                torchgen_patch.uninstall()
        if ops:  # the runtime ops, and the entries
            rep = torchgen_patch.install(runtime_ops=[o.name for o in ops])
            out["refused"] = rep.refused
            try:
                out["checks"]["patched"] = _checks(check)
            finally:
                torchgen_patch.uninstall()
    return out


def _probes(modules: list[str]) -> list[dict]:
    """lint --runtime --import's optimizer rule on the library's modules, with no overlay (what the
    rule finds): each optimizer class they define, probed, and the shipped overlay's entry that
    covers it, if any."""
    from torchgen_patch.plan.overlay import load_runtime
    from torchgen_patch.runtime.optim import covering
    from torchgen_patch.runtime.optim_probe import optimizer_classes, probe_modules
    from torchgen_patch.sources import shipped_overlay

    entries = load_runtime(shipped_overlay()).optimizers
    covered = {}
    for cls in optimizer_classes(modules):
        e = covering(entries, cls)
        covered[f"{cls.__module__}.{cls.__qualname__}"] = e.line if e is not None else None
    return [{"class": p.cls, "outcome": str(p.outcome), "detail": p.detail, "through": list(p.through),
             "given": list(p.given), "entry": covered.get(p.cls)} for p in probe_modules(modules, {})]


def _rel(path: str | None) -> str:
    if not path:
        return "(unknown)"
    i = path.find("site-packages/")
    return path[i + len("site-packages/"):] if i >= 0 else path


FIX = ("Define the operator with `torch.library.custom_op(..., mutates_args=[...])`, which registers an "
       "ADInplaceOrView kernel that bumps what the op writes; or, for an op defined with "
       "`torch.library.Library(...).define`, register one for the `ADInplaceOrView` key that calls the op below "
       "it (`torch._C._AutoDispatchBelowADInplaceOrView`) and then bumps each written tensor "
       "(`torch.autograd.graph.increment_version`). Until then, users can run "
       "`torchgen_patch.install(runtime_ops=[{patterns}])`.")


def markdown(results: list[dict]) -> str:
    torch_v = next((r["torch"] for r in results if r.get("torch")), "?")
    lines = ["# Extension libraries: mutating custom ops without a version-counter kernel", "",
             f"torch {torch_v}, CPU. Produced by `python scripts/ecosystem_audit.py` (each library in a fresh "
             "interpreter; its namespaces are the operators its import registered). \"silent\" means autograd used "
             "a tensor that the step had overwritten without an error; \"raises\" is PyTorch's "
             "\"modified by an inplace operation\" error, the correct behaviour. The last column is "
             "`lint --runtime --import`'s optimizer rule on the library's modules: every optimizer class they define, "
             "given a probe step on a tiny parameter with no overlay; \"unseen\" changes its parameter without a "
             "version bump, and each unseen class has an entry in the shipped overlay or is named without one. "
             "\"entries\": plain `install()`, the shipped overlay's optimizer entries and no runtime ops; "
             "\"runtime ops\": `install(runtime_ops=[those ops])`, the entries too.", "",
             "| library | version | namespaces | mutating ops without a kernel | consequence unpatched | entries | "
             "runtime ops | optimizer classes (`lint --runtime --import`'s probe step) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in results:
        summary = ", ".join(f"{v} {k}" for k, v in _tally(r["checks"].get("unpatched", {})).items()) or "(no check)"
        esummary, psummary = (", ".join(f"{v} {k}" for k, v in _tally(r["checks"].get(phase, {})).items()) or "—"
                              for phase in ("entries", "patched"))
        err = "; ".join(f"`{m}`: {e}" for m, e in r["import_errors"].items())
        lines.append(f"| {r['dist']} | {r['version'] or '—'} | {', '.join(r.get('namespaces', [])) or '—'} | "
                     f"{len(r['ops'])} | {summary}{' (import: ' + err + ')' if err else ''} | {esummary} | "
                     f"{psummary} | {_probe_tally(r.get('optimizers', []))} |")
    for r in results:
        lines += ["", f"## {r['dist']} {r['version'] or ''}".rstrip(), ""]
        if r["import_errors"]:
            for m, e in r["import_errors"].items():
                lines.append(f"- could not import `{m}`: {e}")
            lines.append("")
        if not r["ops"]:
            lines.append("No mutating operator without an ADInplaceOrView kernel in its namespaces"
                         + (f" ({', '.join(r.get('namespaces', []))})." if r.get("namespaces") else
                            " (it registers no operators on import)."))
        else:
            lines += [f"{len(r['ops'])} mutating operators without an ADInplaceOrView kernel:", "",
                      "| operator | writes | defined at |", "|---|---|---|"]
            lines += [f"| `{o['name']}` | {', '.join(o['written'])} | {_rel(o['location'])} |" for o in r["ops"]]
        for phase, title in PHASES.items():
            if r["checks"].get(phase):
                lines += ["", f"Check, {title}:", ""]
                lines += [f"- {k}: **{v}**" for k, v in r["checks"][phase].items()]
        if r.get("optimizers"):
            lines += ["", f"Optimizer classes its modules define, each given `lint --runtime --import`'s probe step "
                          f"with no overlay ({_probe_tally(r['optimizers'])}):", "",
                      "| class | probe step | how | shipped entry |", "|---|---|---|---|"]
            lines += [f"| `{p['class']}` | {PROBE_WORDS[p['outcome']]}"
                      f"{' (probed with ' + ', '.join(p['given']) + ')' if p.get('given') else ''} | "
                      f"{p['detail'] or '—'} | "
                      f"{'native_functions_overlay.yaml:' + str(p['entry']) if p.get('entry') else '—'} |"
                      for p in r["optimizers"]]
        if r.get("refused"):
            lines += ["", "Not patched: " + "; ".join(f"`{k}` ({v})" for k, v in sorted(r["refused"].items()))]
        outside = [p["class"] for p in r.get("optimizers", []) if p["outcome"] == "unseen" and not p["through"]]
        if outside:
            lines += ["", "Fix on the library's side, for the optimizers whose step writes outside the dispatcher ("
                      + ", ".join(f"`{c}`" for c in outside) + "): after the C++ update, call "
                      "`torch.autograd.graph.increment_version` on each parameter it wrote (a list in one call, "
                      "torch >= 2.5). Until then, `torchgen-patch run` and `install()` do it with the shipped "
                      "overlay's optimizer entries."]
        silent = [k for k, v in r["checks"].get("unpatched", {}).items() if v.startswith("silent")]
        if silent and r["ops"]:
            ns = ", ".join(f"`{n}`" for n in r["namespaces"])
            patterns = ", ".join(f'"{n}::*"' for n in r["namespaces"])
            lines += ["", "### Issue-ready summary for the maintainers", "",
                      f"**Tensors written by {ns} ops are not version-bumped, so autograd silently uses "
                      "overwritten tensors.**", "",
                      f"With {r['dist']} {r['version']} and torch {torch_v}, {len(silent)} of the scenarios above "
                      "compute gradients from a tensor that was overwritten after it was saved, without the error "
                      "PyTorch raises for its own in-place ops: the ops below write arguments (their schemas say "
                      "`Tensor(a!)`) but have no ADInplaceOrView kernel, so the tensors' version counters never "
                      "move.", "", "Minimal repro: " + _repro(r["dist"]), "",
                      "Affected operators: " + ", ".join(f"`{o['name']}`" for o in r["ops"][:8])
                      + (f" and {len(r['ops']) - 8} more (table above)" if len(r["ops"]) > 8 else ""), "",
                      "Fix on the library's side: " + FIX.format(patterns=patterns)]
            if any(p["through"] and p.get("entry") for p in r.get("optimizers", [])):
                lines += ["", "Its optimizers are also covered by a plain `torchgen-patch run` or `install()`, "
                              "through the shipped overlay's optimizer entries (with the runtime ops as well, "
                              "each parameter still moves once a step)."]
    return "\n".join(lines) + "\n"


PHASES = {"unpatched": "unpatched",
          "entries": "with the shipped overlay's optimizer entries alone (plain `install()`, no runtime ops)",
          "patched": "patched (`install(runtime_ops=[those ops])`, the shipped overlay's entries too)"}
PROBE_WORDS = {"unseen": "**changes the parameter, no version bump**", "bumps": "bumps (seen by autograd)",
               "not_run": "not probed", "unchanged": "not probed"}


def _probe_tally(probes: list[dict]) -> str:
    if not probes:
        return "none"
    t: dict[str, int] = {}
    for p in probes:
        t[p["outcome"]] = t.get(p["outcome"], 0) + 1
    words = {"unseen": "unseen", "bumps": "bump", "not_run": "not probed", "unchanged": "changed nothing"}
    out = [f"{t[k]} {words[k]}" for k in words if k in t]
    if "unseen" in t:
        covered = sum(1 for p in probes if p["outcome"] == "unseen" and p.get("entry"))
        out[0] += f" ({covered} with a shipped entry)"
    return ", ".join(out)


def _tally(d: dict) -> dict:
    t: dict[str, int] = {}
    for v in d.values():
        k = v.split(" (")[0]
        t[k] = t.get(k, 0) + 1
    return t


def _repro(dist: str) -> str:
    if dist == "bitsandbytes":
        return ("`p = torch.nn.Parameter(torch.randn(64, 64)); opt = bnb.optim.Adam8bit([p]); loss = (p * p).sum(); "
                "p.grad = torch.ones_like(p); opt.step(); loss.backward()` — no error, `p._version` stays 0.")
    if dist == "fbgemm-gpu-cpu":
        return ("a CPU `SplitTableBatchedEmbeddingBagsCodegen` with `EmbOptimType.EXACT_SGD`: "
                "`penalty = (tbe.weights_host ** 2).sum(); tbe(ids, offsets).sum().backward(); penalty.backward()` "
                "— no error, `weights_host._version` stays 0. Also: `bounds_check_indices` declares `indices` and "
                "`offsets` written but does not write them in these runs; its schema over-declares.")
    return "see the check above."


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--site", help="extra directory to import libraries from")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        json.dump(worker(args.worker), sys.stdout)
        return 0
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (ROOT, args.site) if p))
    # DeepSpeed builds its CPU ops on first use: once, in the project's cache, as the tests do
    env.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(ROOT, ".cache", "torch_extensions"))
    results = []
    for dist, _, _ in LIBS:
        r = subprocess.run([sys.executable, __file__, "--worker", dist], capture_output=True, text=True, env=env,
                           cwd=ROOT)
        try:
            results.append(json.loads(r.stdout.strip().splitlines()[-1]))
        except (ValueError, IndexError):
            results.append({"dist": dist, "version": None, "import_errors": {dist: r.stderr.strip()[-300:]},
                            "ops": [], "checks": {}})
        print(f"audited {dist}", file=sys.stderr)
    sys.stdout.write(markdown(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
