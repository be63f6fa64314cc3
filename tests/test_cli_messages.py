"""What the CLI says to a person who types a little wrong: each message names the fix."""

from __future__ import annotations

import pytest

from torchgen_patch import cli
from torchgen_patch.cli.parser import parser


def usage_error(capsys, *argv) -> str:
    with pytest.raises(SystemExit) as e:
        cli.main(list(argv))
    out, err = capsys.readouterr()
    assert (e.value.code, out, err.count("\n")) == (2, "", 1)
    return err


def test_no_command_lists_the_commands(capsys):
    assert usage_error(capsys) == ("torchgen-patch: error: give a command: scan, lint, gen, build, install, wheel, "
                                   "verify, run, enable, disable, status, findings, diff (see torchgen-patch --help)\n")


def test_a_misspelt_command_gets_the_closest_one(capsys):
    assert usage_error(capsys, "lnit") == ("torchgen-patch: error: unknown command 'lnit' (did you mean lint?) "
                                           "(see torchgen-patch --help)\n")


def test_a_misspelt_option_is_named_by_its_subcommand(capsys):
    assert usage_error(capsys, "lint", "--formt", "json") == (
        "torchgen-patch lint: error: unrecognized arguments: --formt (did you mean --format?) "
        "(see torchgen-patch lint --help)\n")
    assert "did you mean json?" in usage_error(capsys, "lint", "--format", "jsn")


def test_an_op_without_its_namespace_is_the_aten_op(run_cli):
    rc, out, err = run_cli("install", "--backend", "python", "--op", "_cummax_helper")
    import torchgen_patch

    try:
        assert (rc, err) == (0, "") and "1 registered" in out
        assert "aten::_cummax_helper" in torchgen_patch.installed_ops()
    finally:
        torchgen_patch.uninstall()


@pytest.mark.parametrize("cmd", ["install", "verify", "run"])
def test_an_op_pytorch_already_covers_is_said_so(run_cli, cmd):
    rc, out, err = run_cli(cmd, "--op", "aten::add_.Tensor", *(["--", "true"] if cmd == "run" else []))
    assert (rc, out) == (2, "")
    assert err == ("torchgen-patch: error: aten::add_.Tensor is already covered by PyTorch's codegen (it has a "
                   "generated ADInplaceOrView kernel): nothing to install or verify\n")


@pytest.mark.parametrize("cmd", ["install", "verify", "run"])
def test_a_misspelt_op_gets_the_closest_ones(run_cli, cmd):
    rc, out, err = run_cli(cmd, "--op", "_fused_adm_", *(["--", "true"] if cmd == "run" else []))
    assert (rc, out) == (2, "")
    assert err == ("torchgen-patch: error: not in the plan: aten::_fused_adm_ (hint: did you mean "
                   "aten::_fused_adam_, aten::_fused_adamw_, aten::_fused_sgd_?)\n")


def test_no_compiler_names_the_python_backend(run_cli, monkeypatch):
    monkeypatch.setenv("CXX", "no-such-compiler-xyz")
    rc, out, err = run_cli("build", "-q")
    assert rc == 3 and "--backend python" in err


def test_verbose_promises_the_compilers_commands_only_where_something_compiles():
    help_of = {cmd: " ".join(p.format_help().split()) for cmd, p in parser().commands.items()}
    for cmd in ("scan", "lint", "diff", "gen"):
        assert "compiler's commands" not in help_of[cmd], cmd
    for cmd in ("build", "install", "verify", "run", "wheel"):
        assert "compiler's commands" in help_of[cmd], cmd
