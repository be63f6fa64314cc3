"""Output for people: the verify report opens with its legend and the failing ops, the words of the
output are defined in `--help`, results go to stdout and notes to stderr. No torch, no build."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT
from torchgen_patch.checks import verify
from torchgen_patch.scan.model import VERDICTS


def _r(op: str, verdict: str, before: int = 0, after: int = 1, patched: bool = False) -> verify.OpResult:
    return verify.OpResult(op, "cpu", patched, verdict, [verify.TensorResult("out", before, after)])


def test_verify_report_starts_with_the_legend_and_the_failing_ops_then_every_op():
    runs = {"without patch": [_r("aten::a.out", verify.PASS), _r("aten::b_", verify.MISS, 0, 0),
                              _r("aten::c.out", verify.EXTRA, 0, 2), _r("aten::d_", verify.MISS, 0, 0)],
            "with patch (cpp)": [_r(op, verify.PASS, patched=True) for op in ("aten::a.out", "aten::b_",
                                                                              "aten::c.out", "aten::d_")]}
    text = verify.markdown(runs, {"torch": "x"})
    legend = [text.index(f"- **{v}**: ") for v in verify.LEGEND]
    failing = text.index("## Failing ops")
    table = text.index("| op |")
    assert max(legend) < failing < table
    head = text[failing:table]
    assert "- without patch, MISS (2): `aten::b_`, `aten::d_`" in head
    assert "- without patch, EXTRA (1): `aten::c.out`" in head
    assert "with patch" not in head and "aten::a.out" not in head  # only what failed
    assert text.count("| `aten::") == 4  # and the full table after it


def test_verify_report_says_when_nothing_failed():
    text = verify.markdown({"with patch (cpp)": [_r("aten::a.out", verify.PASS, patched=True)]}, {})
    head = text[text.index("## Failing ops"):text.index("| op |")]
    assert "- none:" in head


def test_help_defines_every_word_of_the_output():
    out = subprocess.run([sys.executable, "-m", "torchgen_patch", "--help"], capture_output=True, text=True,
                         cwd=ROOT, check=True).stdout
    epilog = out[out.index("words used in the output:"):]
    for word in (*VERDICTS, *verify.LEGEND, "drift", "finding", "plan", "overlay", "runtime op"):
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
