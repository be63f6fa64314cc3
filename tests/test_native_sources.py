"""The package's hand-written C++ and CUDA are plain source files (templates/saved/, templates/statement/), not
Jinja and not Python strings; every byte of them is in the keys of the builds that compile them; and the
CUDA source the check hands NVRTC at run time is the one it always was."""

import hashlib
import importlib
import os
import shutil

import pytest

from tests import cxx_sizes
from tests.conftest import ROOT
from torchgen_patch.runtime.compile import key as build_keys
from torchgen_patch.runtime.compile.toolchain import compiler_path, default_flags

render = importlib.import_module("torchgen_patch.codegen.render")  # (the package's name render is its function)

# The fingerprint kernels' source as NVRTC compiled it before it became a plain file (rendered from
# templates/SavedFingerprint.cu.j2), its comments and string literals' contents left out: the tokens NVRTC reads.
KERNEL_TOKENS_SHA256 = "8b80adcdf15f4ba81f70d8fc458ecae0eac65a9facc4fcfd4e3c92d7d2b01355"


def _tokens(source: str) -> str:
    return " ".join(cxx_sizes.clean(source).split())


def test_the_kernel_source_handed_to_nvrtc_is_the_one_it_was():
    source = render.saved_kernel_source()
    with open(os.path.join(ROOT, "templates", "saved", "fingerprint.cu"), encoding="utf-8") as fh:
        assert source == fh.read()  # the file as it is: nothing rendered into it
    assert hashlib.sha256(_tokens(source).encode()).hexdigest() == KERNEL_TOKENS_SHA256
    for kernel in ("fingerprint_dense", "fingerprint_strided", "fingerprint_rows", "fingerprint_batch"):
        assert f'extern "C" __global__ void {kernel}(' in source  # the names cuda_driver.cpp looks up


def test_the_measure_of_tokens_sees_a_change_of_code_not_of_comments():
    source = render.saved_kernel_source()
    assert _tokens(source.replace("// The saved-tensor check's", "// The check's")) == _tokens(source)
    assert _tokens(source.replace("#define MAX_DIMS 8", "#define MAX_DIMS 9")) == _tokens(source)  # a directive
    assert _tokens(source.replace("u64 nbytes", "u64 n_bytes", 1)) != _tokens(source)


def test_the_saved_checks_sources_are_the_files_of_its_folder():
    files = render.render_saved()
    folder = os.path.join(ROOT, "templates", "saved")
    assert sorted(files) == sorted(os.listdir(folder))
    assert {n.rsplit(".", 1)[1] for n in files} == {"cpp", "h", "cu"}
    for name, data in files.items():
        with open(os.path.join(folder, name), "rb") as fh:
            assert fh.read() == data
        assert b"{{" not in data and b"{%" not in data, name  # no Jinja left


def test_the_hooks_one_translation_unit_includes_every_other_part_once_in_name_order(monkeypatch):
    """The library is compiled from one unit that includes the parts (each parsed torch's headers again when
    they were compiled apart): a part added to the folder and left out of the unit would be code never built."""
    compile_stage = importlib.import_module("torchgen_patch.runtime.compile")
    asked = {}
    monkeypatch.setattr(compile_stage, "build", lambda files, *a, **k: asked.update(files=files, **k))
    compile_stage.build_saved()
    assert asked["sources"] == [render.SAVED_UNIT] and asked["files"] == render.render_saved()
    files = render.render_saved()
    parts = sorted(n for n in files if n.endswith(".cpp") and n != render.SAVED_UNIT)
    unit = files[render.SAVED_UNIT].decode()
    assert [line.split('"')[1] for line in unit.splitlines() if line.startswith("#include")] == parts
    assert all(line.startswith(("//", "#include")) or not line.strip() for line in unit.splitlines())


def test_no_cxx_in_the_packages_python():
    found = []
    for d, _, names in os.walk(os.path.join(ROOT, "torchgen_patch")):
        for n in names:
            if n.endswith(".py"):
                with open(os.path.join(d, n), encoding="utf-8") as fh:
                    text = fh.read()
                found += [f"{n}: {w}" for w in ("#include", 'extern "C"', 'extern \\"C\\"') if w in text]
    assert found == []


def test_the_build_statement_is_a_plain_source_and_one_generated_line():
    files = build_keys.identity_source("k" * 64)
    assert sorted(files) == sorted([build_keys.IDENTITY_SOURCE, build_keys.IDENTITY_HEADER])
    with open(os.path.join(ROOT, "templates", "statement", build_keys.IDENTITY_SOURCE), "rb") as fh:
        assert files[build_keys.IDENTITY_SOURCE] == fh.read()
    assert f'extern "C" const char* {build_keys.IDENTITY_SYMBOL}()'.encode() in files[build_keys.IDENTITY_SOURCE]
    line = files[build_keys.IDENTITY_HEADER].decode()
    assert line.count("\n") == 1 and line.startswith('#define TORCHGEN_PATCH_STATED R"tgp({"key": "kkkk')


@pytest.fixture
def templates(tmp_path, monkeypatch):
    """A copy of templates/ that the package reads in place of its own."""
    copy = tmp_path / "templates"
    shutil.copytree(render.templates_dir(), copy)
    monkeypatch.setattr(render, "templates_dir", lambda: str(copy))
    return copy


@pytest.mark.parametrize("path", ["saved/unpack.cpp", "saved/records.h", "saved/fingerprint.cu",
                                  "statement/torchgen_patch_build.cpp"])
def test_a_change_to_a_native_source_is_a_new_build(templates, path):
    """The saved check's build key (its sources) and every library's (the build statement each compiles),
    and the key of the kernels' no-change rebuild (every file templates/ holds): a change to any source they
    compile is a new key, never a stale cached build."""
    from torchgen_patch.runtime import _inputs_key
    from torchgen_patch.sources import Options

    def keys():
        saved = build_keys.build_key(render.render_saved(), default_flags(), compiler_path())
        kernels = build_keys.build_key({"a.cpp": b"int a;\n"}, default_flags(), compiler_path())
        return saved, kernels, _inputs_key(Options(), 1)

    before = keys()
    with open(templates / path, "a", encoding="utf-8") as fh:
        fh.write("// one more line\n")
    after = keys()
    changed = [name for name, a, b in zip(("saved", "kernels", "inputs"), before, after, strict=True) if a != b]
    assert changed == (["saved", "kernels", "inputs"] if path.startswith("statement/") else ["saved", "inputs"])
