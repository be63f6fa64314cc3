"""Output for people: the verify report opens with its legend and the failing ops, the words of the
output are defined in `--help`, results go to stdout and notes to stderr. No torch, no build."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT
from torchgen_patch.checks import render, verify
from torchgen_patch.scan.model import VERDICTS


def _r(op: str, verdict: str, before: int = 0, after: int = 1, patched: bool = False) -> verify.OpResult:
    return verify.OpResult(op, "cpu", patched, verdict, [verify.TensorResult("out", before, after)])


def test_verify_report_starts_with_the_legend_and_the_failing_ops_then_every_op():
    runs = {"without patch": [_r("aten::a.out", verify.PASS), _r("aten::b_", verify.MISS, 0, 0),
                              _r("aten::c.out", verify.EXTRA, 0, 2), _r("aten::d_", verify.MISS, 0, 0)],
            "with patch (cpp)": [_r(op, verify.PASS, patched=True) for op in ("aten::a.out", "aten::b_",
                                                                              "aten::c.out", "aten::d_")]}
    text = render.markdown(runs, {"torch": "x"})
    legend = [text.index(f"- **{v}**: ") for v in render.LEGEND]
    failing = text.index("## Failing ops")
    table = text.index("| op |")
    assert max(legend) < failing < table
    head = text[failing:table]
    assert "- without patch, MISS (2): `aten::b_`, `aten::d_`" in head
    assert "- without patch, EXTRA (1): `aten::c.out`" in head
    assert "with patch" not in head and "aten::a.out" not in head  # only what failed
    assert text.count("| `aten::") == 4  # and the full table after it


def test_verify_report_says_when_nothing_failed():
    text = render.markdown({"with patch (cpp)": [_r("aten::a.out", verify.PASS, patched=True)]}, {})
    head = text[text.index("## Failing ops"):text.index("| op |")]
    assert "- none:" in head


def test_help_defines_every_word_of_the_output():
    out = subprocess.run([sys.executable, "-m", "torchgen_patch", "--help"], capture_output=True, text=True,
                         cwd=ROOT, check=True).stdout
    epilog = out[out.index("words used in the output:"):]
    for word in (*VERDICTS, *render.LEGEND, "drift", "finding", "plan", "overlay", "runtime op"):
        assert f"\n  {word} " in epilog, word


def test_make_run_ends_with_the_next_step_for_each_audience():
    """The run recipe's last lines: one per audience, each with a command the CLI accepts."""
    import re
    import shlex

    from torchgen_patch.cli.parser import parser

    make = open(f"{ROOT}/Makefile", encoding="utf-8").read()
    recipe = make[make.index("\nrun:") + 1:].split("\n\n", 1)[0].splitlines()[1:]
    assert all(line.startswith("\t") for line in recipe)
    steps = [line for line in recipe if "@echo" in line and "torchgen-patch " in line]
    assert recipe[-len(steps):] == steps  # the recipe ends with them
    assert [re.search(r'"\s*(\w[\w /]*?):', s).group(1) for s in steps] == \
        ["train with torch", "maintain PyTorch/fork", "write an extension"]
    for s in steps:
        cmd = s[s.index("torchgen-patch ") + len("torchgen-patch "):].rstrip('"')
        argv = shlex.split(cmd.split("(")[0].replace("YOURLIB", "mylib"))
        parser().parse_args(argv[:argv.index("--")] if "--" in argv else argv)  # exits 2 when refused


def _run_recipe() -> list[str]:
    make = open(f"{ROOT}/Makefile", encoding="utf-8").read()
    return make[make.index("\nrun:") + 1:].split("\n\n", 1)[0].splitlines()[1:]


def test_make_run_verifies_once_and_its_verify_exit_code_decides():
    """verify --both exits by the run with the patch, so the job runs it once, and a failure with the
    patch fails the job (no `|| [ $? -eq 1 ]` that would swallow it)."""
    calls = [line for line in _run_recipe() if "torchgen-patch verify" in line and "@echo" not in line]
    assert len(calls) == 1 and " --both " in calls[0], calls
    assert "||" not in calls[0]


def test_every_shipped_lint_gate_checks_both_halves():
    """The lintrunner blocks, the pre-commit hook and `make run` lint the requires-grad half too."""
    import tomllib

    import yaml

    text = open(f"{ROOT}/lintrunner.toml.example", encoding="utf-8").read()
    blocks = text.split("# --- ")[1:]
    commands = [tomllib.loads(b.split("\n", 1)[1])["linter"][0]["command"] for b in blocks]
    hooks = yaml.safe_load(open(f"{ROOT}/.pre-commit-hooks.yaml", encoding="utf-8"))
    commands += [h["entry"].split() for h in hooks]
    commands += [line.split()[:-1] for line in _run_recipe() if "torchgen-patch lint" in line and "@echo" not in line]
    assert len(commands) == 4, commands
    for command in commands:
        assert command[1:2] == ["lint"] and "--requires-grad" in command, command


def test_runtime_lint_hints_name_the_namespace():
    """`lint --runtime --import LIB` alone lists every namespace's ops (255 with bitsandbytes, 6 of
    them its own): each such command the README, the docs and `make run` give names --namespace. A
    mention of the optimizer probe (its findings are classes, which --namespace does not filter) is
    not such a command."""
    import glob
    import re

    pages = [f"{ROOT}/README.md", f"{ROOT}/Makefile"] + [p for p in glob.glob(f"{ROOT}/docs/*.md")
                                                           if not p.endswith("cli.md")]
    seen = 0
    for page in pages:
        text = open(page, encoding="utf-8").read()
        for m in re.finditer(r"lint --runtime --import\s+\S+([^`\n]*(?:\n[^`\n]*)?)", text):
            if "optimizer" in m.group(1):
                continue
            seen += 1
            assert "--namespace" in m.group(1).split("`")[0], (page, m.group(0))
    assert seen >= 3


def test_a_count_of_one_reads_in_the_singular():
    """Every count for people through the one helper: "1 kernel", "1 optimizer entry", "1 class derives"."""
    from torchgen_patch.errors import Location
    from torchgen_patch.runtime.install import InstallReport
    from torchgen_patch.runtime.optim_probe import StepProbe, _as_base
    from torchgen_patch.runtime.launch.process import kernels_line
    from torchgen_patch.vocabulary import StepOutcome, plural

    assert [plural(n, "kernel") for n in (0, 1, 2)] == ["0 kernels", "1 kernel", "2 kernels"]
    assert [plural(n, "entry", "entries") for n in (1, 2)] == ["1 entry", "2 entries"]
    assert kernels_line(1, "cpp", 0, "built now", 1) == \
        "torchgen-patch: 1 kernel active (cpp), 0 refused, built now; 1 optimizer entry active"
    assert kernels_line(2, "python", 1, None, 0) == \
        "torchgen-patch: 2 kernels active (python), 1 refused; 0 optimizer entries active"
    assert InstallReport("cpp", registered=["aten::a.out"], optimizers=["torch.optim.AdamW"]).summary() == \
        "torchgen-patch install (cpp): 1 registered, 0 already active, 0 refused; 1 optimizer entry active"

    class Base:
        pass

    class Sub(Base):
        pass

    probe = StepProbe("m.Base", Location("m.py", 1), StepOutcome.NOT_RUN, "it needs optimizer_name")
    assert _as_base(probe, Base, [Base, Sub]).detail == "it needs optimizer_name (1 class probed here derives from it)"
    assert _as_base(probe, Base, [Base, Sub, type("Other", (Sub,), {})]).detail == \
        "it needs optimizer_name (2 classes probed here derive from it)"
