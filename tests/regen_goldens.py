"""Regenerate the golden files under tests/golden/ (`make goldens`).

The goldens are the codegen's output for a small yaml made from the installed
torch's own entries (tests/yaml_fixtures.py), plus one kernel file per op, and
one file per output format: lint's, the scan's, verify's and the saved-tensor
check's.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
GOLDEN = os.path.join(HERE, "golden")


def render_goldens() -> dict[str, bytes]:
    sys.path.insert(0, os.path.dirname(HERE))
    from tests.yaml_fixtures import golden_yaml
    from tests.support import scan_of
    from torchgen_patch.codegen.render import environment, render
    from torchgen_patch.plan import make_plan
    from torchgen_patch.plan.overlay import empty

    with tempfile.TemporaryDirectory() as d:
        native, tags = golden_yaml(d)
        plan = make_plan(scan_of(native, tags, cache=False), empty())
    files = {k: v for k, v in render(plan, 1).items() if k != "ADInplaceOrViewPatchEverything.cpp"}
    env = environment()
    for k in plan.kernels:
        files[f"kernels/{k.name}.cpp"] = env.get_template(k.template).render(k=k).encode()
    files.update(format_goldens())
    return files


def format_goldens() -> dict[str, bytes]:
    """One golden per output format (ruff's snapshot style): the lint findings of the golden yaml
    in every lint format, a live-registry report, and a verify report in each of its formats."""
    import dataclasses

    from tests.yaml_fixtures import golden_yaml
    from tests.support import scan_of
    from torchgen_patch.checks import render as vr
    from torchgen_patch.checks import verify as v
    from torchgen_patch.diagnostics import Finding, rules
    from torchgen_patch.diagnostics.lint import findings
    from torchgen_patch.diagnostics.render import RENDERERS, Summary, scan_text
    from torchgen_patch.errors import Location
    from torchgen_patch.plan.overlay import empty
    from torchgen_patch.runtime.optim_probe import StepProbe
    from torchgen_patch.runtime.registry import RuntimeOp
    from torchgen_patch.vocabulary import StepOutcome
    from torchgen_patch.scan.model import VERDICTS

    with tempfile.TemporaryDirectory() as d:
        native, tags = golden_yaml(d)
        sc = scan_of(native, tags, cache=False)
        fs = [dataclasses.replace(f, loc=Location("native_functions.yaml", f.loc.line)) for f in findings(sc, empty())]
        counts = {k: sc.counts()[k] for k in VERDICTS}
        moved = dataclasses.replace(sc, records=tuple(
            r._replace(loc=Location("native_functions.yaml", r.loc.line)) for r in sc.records))
        scan_table = scan_text(moved).encode()
    fs.append(rules.stale_baseline("baseline.json", 3, "aten::gone_", rules.MISSING.id))
    fs = sorted(fs, key=Finding.sort_key)
    yaml_summary = Summary("yaml", counts, "2.13.0+cpu", ("native_functions.yaml",), "baseline.json", 1)
    runtime = [rules.missing_at_runtime(RuntimeOp("ext::write_one", "ext::write_one(Tensor(a!) out) -> ()",
                                                  ("out",), Location("ext/ops.py", 12))),
               rules.missing_at_runtime(RuntimeOp("ext::write_far", "ext::write_far(Tensor(a!) out) -> ()",
                                                  ("out",), Location(None, None)))]
    runtime_summary = Summary(source="runtime", left_out=1)
    # lint --runtime --import's optimizer rule: an unseen write each way, a class not probed, one covered
    S, Out = StepProbe, StepOutcome
    optim = sorted([rules.optimizer_probe(p) for p in (
        S("ext.optim.PybindAdam", Location("ext/optim.py", 10), Out.UNSEEN,
          "it writes the parameter outside the dispatcher (C++ bound with pybind, data_ptr, numpy)"),
        S("ext.optim.OpAdam", Location("ext/optim.py", 40), Out.UNSEEN,
          "it writes the parameter through ext::adam_update, which has no ADInplaceOrView kernel",
          ("ext::adam_update",)),
        S("ext.optim.ShardedAdam", Location("ext/optim.py", 70), Out.NOT_RUN,
          "its step raised RuntimeError: Default process group has not been initialized"))], key=Finding.sort_key)
    optim_summary = Summary(source="runtime", probed=5, covered=("ext.optim.CoveredAdam",))
    out = {"formats/scan.text": scan_table}  # the scan's JSON names this machine's paths: tests/test_lint.py
    for fmt, render in RENDERERS.items():
        out[f"formats/lint.{fmt}"] = render(fs, yaml_summary).encode()
        out[f"formats/lint-runtime.{fmt}"] = render(runtime, runtime_summary).encode()
        out[f"formats/lint-optimizers.{fmt}"] = render(optim, optim_summary).encode()
    T = v.TensorResult
    runs = {
        "without patch": [v.OpResult("aten::_cummax_helper", "cpu", False, v.MISS,
                                     [T("values", 0, 0), T("indices", 0, 0)]),
                          v.OpResult("aten::_fused_adam_", "cpu", False, v.NOT_RUN, message="no sample on cpu")],
        "with patch (cpp)": [v.OpResult("aten::_cummax_helper", "cpu", True, v.PASS,
                                        [T("values", 0, 1), T("indices", 0, 1)]),
                             v.OpResult("aten::_fused_adam_", "cpu", True, v.XFAIL, [T("self[0]", 0, 2)],
                                        "expected to fail on cpu: bumps twice | once per step")],
    }
    meta = {"torch": "2.13.0+cpu", "device": "cpu", "python": "3.11.7", "ops": 2,
            "command": "torchgen-patch verify --both"}
    out["formats/verify.text"] = "".join(f"== {name}\n" + vr.table(rs) for name, rs in runs.items()).encode()
    out["formats/verify.json"] = vr.to_json(runs, meta).encode()
    out["formats/verify.markdown"] = vr.markdown(runs, meta).encode()
    out.update(saved_goldens())
    out.update(fleet_goldens())
    return out


def saved_goldens() -> dict[str, bytes]:
    """The saved-tensor check's renderers, one golden each: the stderr line of every finding
    (``warn``), the exception's message of every finding (``raise``), the JSON of them all, and the
    count at exit in its cases (none found, one, several with contents not read)."""
    from torchgen_patch.saved import render as sr
    from torchgen_patch.saved.finding import Finding, Frame
    from torchgen_patch.vocabulary import Writer as W

    findings = [
        # a parameter an optimizer's step wrote outside the dispatcher (the line of its step() call known), on a
        # rank, saved inside a library, in the model's own forward, which the program called at train.py:52
        Finding((64, 64), "float32", "cuda:0", 3, "layers.0.weight", "GPT2Model", node="MmBackward0",
                forward=Frame("train.py", 41, "forward"), site=Frame("lib/attn.py", 12, "attention"),
                call=Frame("train.py", 52, "main"), backward=Frame("train.py", 57, "main"), writers=(W.OPTIMIZER,),
                optimizer="bitsandbytes.optim.Adam8bit", step=Frame("train.py", 55, "main"), rank=1),
        # a view of a buffer given other storage
        Finding((8,), "bfloat16", "cpu", 0, "ln.running_mean", "Block", view=True, node="MulBackward0",
                forward=Frame("model.py", 9, "step"), backward=Frame("model.py", 20, "step"),
                writers=(W.STORAGE, W.DATA, W.ALIAS, W.KERNEL)),
        # a tensor of no module, from the program's own hooks, where no frame was found
        Finding((2, 3), "float16", "cpu", 1, writers=(W.HOOKS, W.ALIAS, W.KERNEL, W.DATA)),
        # a parameter of no known module, its name and frame with characters a terminal would obey
        Finding((), "float64", "cpu", 2, "emb\x1b[2J.weight", node="SumBackward0",
                forward=Frame("run\n.py", 3, "<module>"), backward=Frame("run\n.py", 4, "<module>"),
                writers=(W.DATA, W.ALIAS, W.KERNEL)),
        # a library's kernel writing into its input, and an alias written, each named first
        Finding((4, 50257), "bfloat16", "cuda:0", 0, node="SoftmaxBackward0", forward=Frame("train.py", 30, "loss"),
                backward=Frame("train.py", 33, "main"), writers=(W.KERNEL, W.ALIAS, W.DATA)),
        Finding((16,), "float32", "cpu", 0, "ema.shadow", "EMA", node="MulBackward0",
                forward=Frame("ema.py", 5, "forward"), backward=Frame("ema.py", 9, "step"),
                writers=(W.ALIAS, W.KERNEL, W.DATA)),
        # a Triton kernel launched between save and use with a pointer into the saved logits (liger-kernel's
        # cross entropy writing the gradient into its input), with the line that launched it
        Finding((8, 32000), "float32", "cuda:0", 0, node="TanhBackward0", forward=Frame("train.py", 38, "forward"),
                call=Frame("train.py", 40, "step"), backward=Frame("train.py", 44, "step"),
                writers=(W.TRITON, W.ALIAS, W.KERNEL, W.DATA), kernel="_liger_cross_entropy_kernel",
                launch=Frame("train.py", 42, "step")),
    ]
    summaries = [sr.summary(0, 0, 120, {}, ""),
                 sr.summary(1, 1, 7, {}, " in pid 4242"),
                 sr.summary(5, 2, 1031, {"nested tensors": 2, "meta tensors (no data)": 1}, " in pid 4242 (rank 1)")]
    return {"formats/saved.line": "".join(sr.line(f) + "\n" for f in findings).encode(),
            "formats/saved.message": "".join(sr.message(f) + "\n\n" for f in findings).encode(),
            "formats/saved.json": sr.to_json(findings).encode(),
            "formats/saved.summary": "".join(t + "\n" for t in summaries).encode()}


def fleet_records():
    """The files of a small fleet, written out by hand (file name -> its bytes): two ranks on two hosts
    finding an optimizer's write at three steps each, a third process (no rank) finding another site,
    a site of five layers' weights (named by a class with markup in its name), one finding outside a
    backward pass with no frame, one whose name and frame hold characters a terminal would obey, and
    a line cut short."""
    from torchgen_patch.saved.finding import Finding, Frame
    from torchgen_patch.saved.fleet import Record
    from torchgen_patch.vocabulary import Writer as W

    weight = dict(shape=(64, 64), dtype="float32", device="cuda:0", version=3, name="layers.0.weight",
                  owner="GPT2Model", node="MmBackward0", forward=Frame("train.py", 41, "forward"),
                  site=Frame("lib/attn.py", 12, "attention"), backward=Frame("train.py", 57, "main"),
                  writers=(W.OPTIMIZER, W.DATA, W.ALIAS, W.KERNEL), optimizer="bitsandbytes.optim.Adam8bit")
    stats = Finding((8,), "bfloat16", "cpu", 0, "ln.running_mean", "Block", view=True, node="MulBackward0",
                    forward=Frame("model.py", 9, "step"), backward=Frame("model.py", 20, "step"),
                    writers=(W.STORAGE, W.DATA, W.ALIAS, W.KERNEL))
    files = {
        "findings-node-a-101.jsonl": [Record("node-a", 101, s, Finding(**weight, rank=0)) for s in (3, 4, 5)],
        "findings-node-b-202.jsonl": [Record("node-b", 202, s, Finding(**weight, rank=1)) for s in (3, 4, 5)]
        + [Record("node-b", 202, 5, Finding(**{**weight, "name": "layers.0.bias", "shape": (64,)}, rank=1))],
        "findings-node-a-303.jsonl": [Record("node-a", 303, 7, stats)] + [
            Record("node-a", 303, 2, Finding((8, 8), "float32", "cpu", 0, f"blocks.{i}.w", "Net<b>", node="MmBackward0",
                                             forward=Frame("model.py", 30, "forward"),
                                             backward=Frame("model.py", 20, "step"), writers=(W.KERNEL,)))
            for i in range(5)] + [
            Record("node-a", 303, None, Finding((2, 3), "float16", "cpu", 1, writers=(W.HOOKS, W.ALIAS))),
            Record("node-a", 303, 8, Finding((), "float64", "cpu", 2, "emb\x1b[2J.weight", node="SumBackward0",
                                             forward=Frame("run\n.py", 3, "<module>"), writers=(W.DATA,)))],
    }
    out = {name: b"".join(r.to_line() for r in rs) for name, rs in files.items()}
    out["findings-node-b-202.jsonl"] += b'{"v": 1, "host": "node-b", "pid": 2'  # cut short by a full disk
    return out


def fleet_goldens() -> dict[str, bytes]:
    """``torchgen-patch findings``'s report of ``fleet_records`` in each of its formats."""
    from torchgen_patch.checks.fleet import report
    from torchgen_patch.checks.fleet_render import RENDERERS

    with tempfile.TemporaryDirectory() as d:
        for name, data in fleet_records().items():
            with open(os.path.join(d, name), "wb") as fh:
                fh.write(data)
        rep = report(d)
    return {f"formats/findings.{fmt}": render(rep).encode() for fmt, render in RENDERERS.items()}


def main() -> int:
    files = render_goldens()
    if os.path.isdir(GOLDEN):
        shutil.rmtree(GOLDEN)
    for name, data in files.items():
        path = os.path.join(GOLDEN, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as fh:
            fh.write(data)
    print(f"wrote {len(files)} golden files to {os.path.relpath(GOLDEN)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
