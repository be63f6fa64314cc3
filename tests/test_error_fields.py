"""An error carries what a caller acts on as fields (the cause alone, the OS error's errno, the part of
a hint that states what there is): nothing parses an error's message or hint back."""

from __future__ import annotations

import ast
import errno
import os
import types

import pytest

from tests.conftest import ROOT

PKG = os.path.join(ROOT, "torchgen_patch")


def test_a_directory_that_cannot_be_made_says_its_cause_and_errno_as_fields(tmp_path, monkeypatch):
    from torchgen_patch import cache
    from torchgen_patch.fs.dirs import open_dir
    from torchgen_patch.errors import InputError

    def refuse(*_a, **_k):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(cache.os, "mkdir", refuse)
    with pytest.raises(InputError) as e:
        open_dir(str(tmp_path / "new" / "builds"), create=True)
    assert (e.value.cause, e.value.errno) == ("Permission denied", errno.EACCES)
    assert e.value.message == "cannot create the directory: Permission denied"


def test_a_lock_that_cannot_be_opened_says_its_cause_and_errno_as_fields(tmp_path, monkeypatch):
    """Refused (EACCES): the open's own error, its errno a field; any other failure: said as the lock's,
    the errno and the cause carried on. Before, the errno was an attribute set on the exception afterwards
    and the cause was cut out of the message."""
    from torchgen_patch import cache
    from torchgen_patch.fs.dirs import open_dir
    from torchgen_patch.errors import EnvironmentProblem

    d = tmp_path / "c"
    d.mkdir(mode=0o700)
    real = os.open

    for code, text in ((errno.EACCES, "Permission denied"), (errno.EIO, "Input/output error")):
        def failing(path, flags, mode=0o777, *, dir_fd=None, _code=code, _text=text):
            if path == "x.lock":
                raise OSError(_code, _text)
            return real(path, flags, mode, dir_fd=dir_fd)

        monkeypatch.setattr(cache.os, "open", failing)
        with open_dir(str(d)) as here, pytest.raises(EnvironmentProblem) as e:
            with here.lock("x.lock"):
                pass
        monkeypatch.setattr(cache.os, "open", real)
        assert (e.value.errno, e.value.cause) == (code, text)
        assert e.value.message.startswith("cannot open " if code == errno.EACCES else "cannot use the lock ")


def test_a_pattern_that_matches_nothing_names_the_namespaces_as_a_field(monkeypatch):
    """run's check keeps that part and gives its own advice (--import), without cutting the hint apart."""
    from torchgen_patch.errors import InputError
    from torchgen_patch.runtime import install, registry
    from torchgen_patch.runtime.launch import launcher as launch

    monkeypatch.setattr(registry, "uncovered", lambda: [types.SimpleNamespace(name="ns1::a"),
                                                         types.SimpleNamespace(name="ns2::b")])
    with pytest.raises(InputError) as e:
        install.expand_patterns(["nope::*"])
    assert e.value.facts == "namespaces that have such operators: ns1, ns2"
    assert e.value.hint == e.value.facts + "; import the library that defines them first"
    with pytest.raises(InputError) as e:
        launch._check_runtime_ops(["nope::*"], None)
    assert e.value.hint == "namespaces that have such operators: ns1, ns2; " + launch.IMPORT_HINT.format("them")


SPLITTERS = {"split", "rsplit", "partition", "rpartition"}
FIELDS = {"message", "hint"}


def _parsed_back(tree) -> list[int]:
    """Lines that split an error's message or hint (``e.message.rsplit(...)``, ``(e.hint or "").split(...)``,
    ``str(e).split(...)`` of a caught exception) or bolt an attribute onto an exception (``e.errno = ...``)."""
    caught = {h.name for h in ast.walk(tree) if isinstance(h, ast.ExceptHandler) and h.name}
    caught |= {a.arg for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.Lambda))
               for a in f.args.args if a.arg in ("e", "exc", "error")}

    def is_error_text(node) -> bool:
        if isinstance(node, ast.BoolOp):
            return any(is_error_text(v) for v in node.values)
        if isinstance(node, ast.Attribute) and node.attr in FIELDS:
            return True
        return isinstance(node, ast.Call) and getattr(node.func, "id", None) == "str" and node.args and \
            isinstance(node.args[0], ast.Name) and node.args[0].id in caught

    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in SPLITTERS \
                and is_error_text(node.func.value):
            out.append(node.lineno)
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Attribute) and t.attr == "errno" and
                                                  isinstance(t.value, ast.Name) for t in node.targets):
            out.append(node.lineno)
    return out


def test_no_product_code_parses_an_error_message_back():
    found = {}
    for base, dirs, names in os.walk(PKG):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for n in names:
            if n.endswith(".py"):
                path = os.path.join(base, n)
                lines = _parsed_back(ast.parse(open(path, encoding="utf-8").read()))
                if lines:
                    found[os.path.relpath(path, ROOT)] = lines
    assert found == {}


def test_the_check_of_parsed_messages_finds_them():
    code = ("def f(e):\n    a = e.message.rsplit(': ', 1)[-1]\n    b = (e.hint or '').split('; x')[0]\n"
            "    e.errno = 5\n    c = str(e).partition(':')\n    d = 'a: b'.split(': ')\n    g = e.path.split('/')\n")
    assert sorted(_parsed_back(ast.parse(code))) == [2, 3, 4, 5]


def test_what_the_machine_lacks_is_no_bad_input_and_both_are_said_the_same_way(monkeypatch):
    """EnvironmentProblem and InputError are siblings under ToolError: code that catches bad input
    lets what the machine lacks go on with its own exit code. Before, EnvironmentProblem was an
    InputError, and run's --runtime-op check said a missing torch as bad input (exit 2)."""
    from torchgen_patch.errors import EnvironmentProblem, InputError, ToolError
    from torchgen_patch.runtime import install
    from torchgen_patch.runtime.launch import launcher as launch

    assert not issubclass(EnvironmentProblem, InputError) and issubclass(EnvironmentProblem, ToolError)
    assert issubclass(InputError, ToolError)
    e, p = InputError("f.yaml", 3, "bad", "fix it"), EnvironmentProblem("no compiler", "install one")
    assert (e.render(), e.exit_code) == ("f.yaml:3: error: bad (hint: fix it)", 2)
    assert (p.render(), p.exit_code) == ("torchgen-patch: error: no compiler (hint: install one)", 3)

    def lacking(_names):
        raise EnvironmentProblem("--runtime-op needs torch, and this Python has none")

    monkeypatch.setattr(install, "expand_patterns", lacking)
    with pytest.raises(EnvironmentProblem) as raised:
        launch._check_runtime_ops(["ns::*"], None)
    assert raised.value.exit_code == 3 and raised.value.hint is None
