"""The report: reports/pytorch-own-<release>.md rendered from the json, and the results table of the docs
(each between config.BEGIN and config.END)."""

from __future__ import annotations

import glob
import json
import os
import sys

import compat_matrix as cm

from .config import BEGIN, DOCS, END, REPORTS, ROOT, TEST_GROUPS
from .ranks import GLOO_TEARDOWN_DEADLOCK, STUCK_AFTER_S
from .store import atomic_write
from .checkout import codegen_tests_pass
from .verdicts import defects, hang_rates, verdict


def _counts(c: dict, skips: dict | None = None) -> str:
    text = ", ".join(f"{c[k]} {k}" for k in ("passed", "failed", "error", "skipped") if c.get(k)) or "no tests"
    if set(c) == {"skipped"} and skips:  # nothing ran: say why
        text += " (all skipped: " + "; ".join(f"{n}× \"{m}\"" for m, n in skips.items()) + ")"
    return text


def results_table(data: dict) -> str:
    """The docs' table: the real-checkout row and PyTorch's own test files, unpatched against patched."""
    lines = []
    c = data.get("checkout")
    if c and "failed" not in c:
        k = c["counts"]
        lines += ["| tree | functions | covered / missing / unsupported / composite / not_mutating | same as the "
                  "wheel's matrix row | its codegen, `diff --mode fix` | lintrunner VERSIONCOUNTER | "
                  "`tools/test/test_codegen.py` with the fix's cases (unpatched → fixed) |",
                  "|---|---|---|---|---|---|---|",
                  f"| `{data['tarball']}` (Debian) | {c['total']} | {k['covered']} / {k['missing']} / "
                  f"{k['unsupported']} / {k['composite']} / {k['not_mutating']} | {cm._mark(c['matrix_row_same'])} | "
                  f"{c['upstream_before']} → {c['upstream_after']} kernels (added = missing: "
                  f"{cm._mark(c['upstream_added_are_the_missing'])}) | {c['lintrunner_before']} → "
                  f"{c['lintrunner_after']} | {_codegen_tests_cell(c.get('codegen_tests'))} |", ""]
    elif c:
        lines += [f"Checkout world: **fails**: {c['failed']}", ""]
    lines += [f"PyTorch's own test files, torch {data.get('torch', '?')} on CPU, unpatched and under "
              "`torchgen-patch run`:", "",
              "| test files | unpatched | patched | wall time (unpatched / patched) | differing tests |",
              "|---|---|---|---|---|"]
    for group in TEST_GROUPS:
        t = data.get("tests", {}).get(group)
        if t is None:
            lines.append(f"| {group} | not run | not run | | |")
            continue
        diff = "; ".join(f"`{d['test']}` ({d['unpatched']} → {d['patched']}: {verdict(d, t)[0]})"
                        for d in t["differ"])
        u, p = t["unpatched"], t["patched"]
        label = group + (f" ({t['runs']} runs a side; counts are test runs)" if t.get("runs", 1) > 1 else "")
        lines.append(f"| {label} | {_counts(u['counts'], u.get('skip_reasons'))} | "
                     f"{_counts(p['counts'], p.get('skip_reasons'))} | "
                     f"{t['unpatched']['wall_s']:.0f} s / {t['patched']['wall_s']:.0f} s | {diff or 'none'} |")
    return "\n".join(lines + [""] + instructions_lines()) + "\n"


def instructions_lines() -> list[str]:
    """The per-call cost in instructions `make bench` committed (reports/bench-callgrind-cpu-torch*.json),
    beside the wall times: what PyTorch's reviewers judge a dispatcher change by."""
    paths = sorted(glob.glob(os.path.join(REPORTS, "bench-callgrind-cpu-torch*.json")))
    if not paths:
        return ["Per-call cost in instructions: not measured (`make bench BENCH_ARGS='--only callgrind --report'`)."]
    data = json.load(open(paths[-1], encoding="utf-8"))
    name = os.path.basename(paths[-1])
    if "not_run" in data:
        return [f"Per-call cost in instructions ([{name}](../reports/{name})): not run: {data['not_run']}."]
    c = {x["name"]: x["instructions"] for x in data["calls"]}
    before, after = c["unpatched"], c["pytorch-shaped"]
    return [f"Per-call cost in instructions, beside these wall times (callgrind through "
            f"`Timer.collect_callgrind`, torch {data['torch']} on CPU, one thread, mean over {data['number']} calls; "
            f"`make bench`, [{name}](../reports/{name})): `_foreach_add_.Scalar` on one tensor, {before:,} without a "
            f"kernel, {after:,} with the kernel the fixed codegen emits ({after - before:+,}, "
            f"{100 * (after - before) / before:+.1f}%), {c['ours']:,} with this project's; `add_.Scalar` on the same "
            f"tensor, whose kernel PyTorch generates today: {c['generated in-place']:,}."]


def _codegen_tests_cell(t: dict | None) -> str:
    if not t:
        return "not run"
    failed = sum(before == "failed" for before, _ in t["cases"].values())
    passed = sum(after == "passed" for _, after in t["cases"].values())
    return (f"{failed} of {len(t['cases'])} new cases fail → {passed} of {len(t['cases'])} pass; other tests "
            f"{_counts(t['others_before'])} → {_counts(t['others_after'])}")


def _head(data: dict) -> list[str]:
    """The title, what made the report, the tree and torch it is of, and the verdict."""
    out = [f"# PyTorch's own tree, lint and tests: release {data['release']}", "",
           "Made by `make pytorch-check` (`python scripts/pytorch_check.py --report`); "
           "[docs/release-check.md](../docs/release-check.md) says what each step does.", "",
           f"Tree: Debian's source package, `{data['tarball']}` (sha256 {data['tarball_sha256'][:12]}). "
           f"torch: {data.get('torch', 'not installed')} from the package index, on CPU. Wall times: one run of each "
           "side (of a group run several times, the sum of its runs), at low priority (`nice -n 10`); on a machine "
           "shared with other work they say how long the "
           "check takes, not what the patch costs (`bench/` measures that).", ""]
    bad = defects(data)
    out += ["## Verdict", "", "passes: no defect, nothing left unrun" if not bad else "does not pass yet:", ""]
    return out + [f"- {b}" for b in bad] + ([""] if bad else [])


def _checkout_section(c: dict) -> list[str]:
    return ["## Checkout world", "",
            f"`gen --strict`: {c['gen_kernels']} kernels ({c['gen_left_out']} left out). `diff --mode fix` "
            f"edits {', '.join(f'`{f}`' for f in c['fix_edits'])}; applied with `git apply`. Lint after it: "
            f"{c['patched_findings']} findings. The tree's own codegen, `VariableType` kernels that refuse out= "
            f"arguments requiring grad: {c['requires_grad_checks_before']} → {c['requires_grad_checks_after']}"
            + (f" (added: {', '.join(f'`{n}`' for n in c['requires_grad_checks_added'])})"
               if c["requires_grad_checks_added"] else "")
            + f"; as ops, {c.get('requires_grad_checks_added_ops', 0)}, exactly the out= ops of `lint --autograd`: "
            f"{cm._mark(bool(c.get('requires_grad_checks_added_are_the_lint_ops')))}. {c['wall_s']:.0f} s.", ""
            ] + _codegen_tests_lines(c.get("codegen_tests"))


def _codegen_tests_lines(t: dict | None) -> list[str]:
    """The tree's tools/test/test_codegen.py with the fix's cases, unpatched and fixed."""
    if not t:
        return ["`tools/test/test_codegen.py` with the fix's cases: not run.", ""]
    out = ["The tree's own codegen tests, `tools/test/test_codegen.py` with the cases the fix adds (pytest from the "
           "tree's root, its `pytest.ini`, in a venv without torch), on the unpatched codegen and on the fixed one:",
           "", "| test | unpatched codegen | fixed codegen |", "|---|---|---|"]
    out += [f"| `{name}` | {before} | {after} |" for name, (before, after) in sorted(t["cases"].items())]
    out.append(f"| the file's other tests | {_counts(t['others_before'])} | {_counts(t['others_after'])} |")
    return out + ["", f"Fails unpatched and passes fixed: {cm._mark(codegen_tests_pass(t))}.", ""]


def _adapters_section(a: dict) -> list[str]:
    out = ["## PyTorch's lint adapters on the fix's files", "",
           "Files: " + ", ".join(f"`{f}`" for f in a["files"]) + ".", "", "| linter | files | result |",
           "|---|---|---|"]
    for code, e in sorted(a["linters"].items()):
        res = (f"not run: {e['not_run']}" if "not_run" in e else
               "clean" if not (e["findings"] or e["failures"]) else
               "; ".join([f"{m['path']}:{m['line']}: {m['severity']}: {m['name']}" for m in e["findings"]]
                         + [f"adapter failed: {f}" for f in e["failures"]]))
        out.append(f"| {code} | {', '.join(f'`{f}`' for f in e['files'])} | {res} |")
    return out + [""]


def _regression_section(r: dict) -> list[str]:
    return ["## The fix's regression test in the tree", "",
            f"`{r['file']}`, run from `test/`: unpatched {_counts(r['unpatched']['counts'])} (exit "
            f"{r['unpatched']['rc']}); under `torchgen-patch run` {_counts(r['patched']['counts'])} (exit "
            f"{r['patched']['rc']}). Fails unpatched: {cm._mark(r['fails_unpatched'])}; passes patched: "
            f"{cm._mark(r['passes_patched'])}.", ""]


def _stuck_lines(tests: dict) -> list[str]:
    """The group runs' stuck ranks, by group and side, and the test runs a rank timeout failed, by cause."""
    stuck = [(g, side, tests[g][side]["stuck"]) for g in TEST_GROUPS if g in tests
             for side in ("unpatched", "patched") if tests[g][side].get("stuck")]
    if not stuck:
        return []
    out = [f"Ranks of multi-process tests alive after {STUCK_AFTER_S} s (each finishes in about 10 s here) "
           "were dumped with py-spy before PyTorch's own timeout ended them, in the group runs:", ""]
    out += [f"- {g}, {side}: {st['ranks']} ranks stuck"
            + (f" ({st['failed_dumps']} py-spy could not dump)" if st.get("failed_dumps") else "")
            + "; test runs failed by a rank timeout: "
            + (", ".join(f"{n} by {c}" for c, n in sorted(st["tests_by_cause"].items())) or "none")
            + (f" (of {hang_rates(tests[g])[side][1]} test runs)" if tests[g].get("runs", 1) > 1 else "")
            for g, side, st in stuck]
    return out + [""]


def _groups_section(tests: dict) -> list[str]:
    out = ["## Test groups", "", "Each group run with pytest from the tree's `test/` folder (`python -m pytest "
           "FILES --junit-xml=...`), then the same under `torchgen-patch run --`:", ""]
    out += [f"- {g}: " + ", ".join(f"`test/{f}`" for f in tests[g]["files"])
            + "".join(f"; `{k}={v}`" for k, v in sorted(tests[g].get("env", {}).items()))
            + (f"; run {tests[g]['runs']} times on each side, alternating" if tests[g].get("runs", 1) > 1 else "")
            + "".join(f"; {side}: no py-spy, stuck ranks not dumped" for side in ("unpatched", "patched")
                      if tests[g].get(side, {}).get("no_py_spy"))
            for g in TEST_GROUPS if g in tests]
    out += [""] + _stuck_lines(tests)
    for g in TEST_GROUPS:
        if tests.get(g, {}).get("deadlock_stack"):
            out += [f"{GLOO_TEARDOWN_DEADLOCK} as a stuck rank of {g} shows it (py-spy, native and Python "
                    "frames): the main thread destroys the process group holding the GIL and joins gloo's "
                    "worker threads; a worker, destroying a finished work's tensors, waits for the GIL.", "",
                    "```", tests[g]["deadlock_stack"], "```", ""]
    return out


def _differing_section(tests: dict) -> list[str]:
    diffs = [(g, d) for g, t in tests.items() for d in t["differ"]]
    if not diffs:
        return []
    out = ["## Differing tests", "", "| test | unpatched | patched | verdict | why |", "|---|---|---|---|---|"]
    out += [f"| `{d['test']}` ({g}) | {d['unpatched']} | {d['patched']} | {' | '.join(verdict(d, tests[g]))} |"
            for g, d in diffs]
    return out + [""]


def report_md(data: dict) -> str:
    out = _head(data) + ["## Results", "", results_table(data)]
    c = data.get("checkout")
    if c and "failed" not in c:
        out += _checkout_section(c)
    if data.get("adapters"):
        out += _adapters_section(data["adapters"])
    if data.get("regression"):
        out += _regression_section(data["regression"])
    tests = data.get("tests", {})
    if tests:
        out += _groups_section(tests)
    return "\n".join(out + _differing_section(tests))


def doc_block(text: str) -> str | None:
    if BEGIN not in text or END not in text:
        return None
    return text.split(BEGIN, 1)[1].split(END, 1)[0].lstrip("\n")


def write_docs(data: dict) -> None:
    """The results table into each of DOCS, between BEGIN and END."""
    for doc in DOCS:
        text = open(doc, encoding="utf-8").read()
        if doc_block(text) is None:
            sys.exit(f"error: {os.path.relpath(doc, ROOT)} has no '{BEGIN}' ... '{END}' block for the table")
        head, rest = text.split(BEGIN, 1)
        atomic_write(doc, head + BEGIN + "\n" + results_table(data) + rest[rest.index(END):])
