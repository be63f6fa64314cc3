"""The launch spec as one typed value: parsed and checked in one place, written by one serializer,
read as fields everywhere (run's variable, an enabled environment's data file, the hook)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from torchgen_patch.errors import InputError

PKG = os.path.join(ROOT, "torchgen_patch")
SITE = os.path.join(PKG, "runtime", "site")


def _spec(**kw):
    from torchgen_patch.runtime import launch
    from torchgen_patch.sources import Options

    return launch.launch_spec(Options(overlay="o.yaml"), kw.pop("backend", "cpp"), kw.pop("ops", ["aten::x"]),
                              kw.pop("runtime_ops", []), kw.pop("imports", []), **kw)


def test_the_spec_reads_back_as_it_was_written_and_the_same_spec_is_the_same_text():
    from torchgen_patch.runtime.launch.spec import LaunchSpec
    from torchgen_patch.vocabulary import Backend, CheckMode

    spec = _spec(imports=["m"], runtime_ops=["ns::*"], check_saved="raise", strict=True, quiet=True)
    back = LaunchSpec.parse(spec.to_json(), "$TORCHGEN_PATCH_RUN")
    assert back == spec and back.to_json() == spec.to_json()
    assert back.backend is Backend.CPP and back.check_saved is CheckMode.RAISE and back.ops == ("aten::x",)
    assert os.path.isabs(back.options.overlay)  # every process installs from the parent's inputs
    assert json.loads(spec.to_json())["options"]["overlay"] == back.options.overlay


def test_an_enabled_environments_toolchain_reads_back_and_only_a_whole_one_is_used():
    """The toolchain `enable` ran with (compiler, the driver's PATH, extra flags) travels in the spec as a
    table of strings; one of other types is refused like every field, and one that is not whole (a key
    missing, a relative compiler) is none: the process uses its own. Before, the key was unknown."""
    import dataclasses

    from torchgen_patch.runtime.compile.toolchain import Compiler
    from torchgen_patch.runtime.launch.spec import LaunchSpec

    table = {"cxx": "/usr/bin/c++", "path": "/usr/bin:/bin", "cflags": "-Werror -g"}
    spec = dataclasses.replace(_spec(), toolchain=table)
    back = LaunchSpec.parse(spec.to_json(), "x.json")
    assert back == spec and back.toolchain == table and "toolchain" not in json.loads(_spec().to_json())
    assert Compiler.from_table(back.toolchain) == Compiler("/usr/bin/c++", "/usr/bin:/bin", ("-Werror", "-g"))
    assert Compiler.from_table(back.toolchain).table() == table
    for partial in ({"cxx": "/usr/bin/c++", "path": "/bin"}, dict(table, cxx="c++"), None):
        assert Compiler.from_table(partial) is None
    d = json.loads(spec.to_json())
    d["toolchain"]["cxx"] = ["/usr/bin/c++"]
    with pytest.raises(InputError, match="'toolchain' is not a table of strings"):
        LaunchSpec.parse(json.dumps(d), "x.json")


@pytest.mark.parametrize("edit,says", [
    (lambda d: d.update(extra=1), "not a launch spec of torchgen-patch (unknown key 'extra')"),
    (lambda d: d.update(check_saved="loud"), "unknown saved-tensor check mode 'loud'"),
    (lambda d: d.update(roots={"yaml": "/x"}),
     "not a launch spec of torchgen-patch ('roots' names no 'torchgen_patch')"),
    (lambda d: d["roots"].update(yaml=3), "not a launch spec of torchgen-patch ('roots' is not a table of strings)"),
    (lambda d: d.update(backend="pyth0n"), "unknown backend 'pyth0n'"),
    (lambda d: d.pop("strict"), "not a launch spec of torchgen-patch ('strict' is NoneType)"),
    (lambda d: d["options"].update(colour=1), "not a launch spec of torchgen-patch (Options.__init__() got an "
                                              "unexpected keyword argument 'colour')"),
])
def test_a_spec_with_a_field_no_torchgen_patch_writes_is_one_line_naming_it(edit, says):
    """Before, a key no torchgen-patch writes and a saved-tensor mode that is none passed the table."""
    from torchgen_patch.errors import InputError
    from torchgen_patch.runtime.launch.spec import LaunchSpec

    d = json.loads(_spec().to_json())
    edit(d)
    with pytest.raises(InputError) as e:
        LaunchSpec.parse(json.dumps(d), "$TORCHGEN_PATCH_RUN")
    assert e.value.render() == f"torchgen-patch: error: $TORCHGEN_PATCH_RUN: {says} (hint: torchgen-patch run " \
                               "sets it: unset it)"


def test_status_names_a_key_of_the_data_file_no_torchgen_patch_writes(tmp_path):
    """Before, the data file's spec passed with any extra key in it (status: enabled, no problem)."""
    from torchgen_patch.runtime.launch import enable as en

    site = tmp_path / "site-packages"
    site.mkdir()
    assert en.enable(_spec(backend="python"), str(site)).problem is None
    data = site / en.DATA
    d = json.loads(data.read_text())
    d["imports_later"] = []
    data.write_text(json.dumps(d))
    assert en.state(str(site)).problem == f"{data}: not a launch spec of torchgen-patch (unknown key 'imports_later')"


def test_the_hook_reads_the_import_list_from_the_spec_not_from_its_text():
    """The modules the hook watches from the start are the spec's ``imports`` as JSON reads them (the
    last of two keys of that name): before, a text holding ``"imports": []`` anywhere was taken for a
    spec without them."""
    from torchgen_patch.runtime.site import _torchgen_patch_hook as hook

    text = _spec(imports=["mylib.ops"]).to_json()
    saved = hook._spec
    try:
        hook._spec = '{"imports": [], ' + text[1:]
        assert hook._watched() == {"torch", "mylib.ops"}
        hook._spec = _spec().to_json()
        assert hook._watched() == {"torch"}
        hook._spec = "{not json"
        assert hook._watched() == {"torch"}  # said at `import torch`, where the tool parses it
    finally:
        hook._spec = saved


def test_the_hook_imports_no_part_of_the_tool_at_interpreter_start():
    """The tool's parse of the spec waits for ``import torch``: a process of run that never imports it
    loads none of the package."""
    code = "import sys; print(sorted(m for m in sys.modules if m.startswith('torchgen_patch')))"
    env = dict(os.environ, PYTHONPATH=SITE, TORCHGEN_PATCH_RUN=_spec(imports=["json"]).to_json())
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd="/")
    assert (r.returncode, r.stdout, r.stderr) == (0, "[]\n", "")


def _package_trees():
    for base, dirs, names in os.walk(PKG):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for n in names:
            if n.endswith(".py"):
                path = os.path.join(base, n)
                yield os.path.relpath(path, ROOT), ast.parse(open(path, encoding="utf-8").read())


def _options_rebuilt(tree) -> list[int]:
    """Lines of ``Options(**x)``: an Options made from a mapping."""
    return [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Call)
            and getattr(node.func, "id", getattr(node.func, "attr", None)) == "Options"
            and any(k.arg is None for k in node.keywords)]


def _spec_indexed(tree) -> list[int]:
    """Lines that read a launch spec as a dict: ``spec["..."]``, ``spec.get(...)``."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == "spec" and \
                isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
            out.append(node.lineno)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" and \
                isinstance(node.func.value, ast.Name) and node.func.value.id == "spec":
            out.append(node.lineno)
    return out


# where an Options is made from a mapping: the spec's parse, once
OPTIONS_FROM_A_MAPPING = {os.path.join("torchgen_patch", "runtime", "launch", "spec.py"): 1}


def test_options_are_rebuilt_from_a_spec_in_one_place_and_nothing_indexes_a_spec():
    rebuilt = {rel: len(lines) for rel, tree in _package_trees() if (lines := _options_rebuilt(tree))}
    assert rebuilt == OPTIONS_FROM_A_MAPPING
    indexed = {rel: lines for rel, tree in _package_trees() if (lines := _spec_indexed(tree))}
    assert indexed == {}, indexed


def test_the_checks_of_rebuilt_options_and_indexed_specs_find_them():
    code = ("def f(spec, **kw):\n    Options(a=1)\n    sources.Options(**spec['options'])\n    x = spec[\"backend\"]\n"
            "    y = spec.get('quiet')\n    z = spec[0]\n")
    tree = ast.parse(code)
    assert _options_rebuilt(tree) == [3] and sorted(_spec_indexed(tree)) == [3, 4, 5]
