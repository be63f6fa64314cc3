"""Patch PyTorch's own autograd codegen (tools/autograd/gen_inplace_or_view_type.py and
tools/autograd/gen_variable_type.py).

The edit is made on the file's real content, located by structure (Python's
``ast``), not by line numbers; when the file no longer has the shape the edit
expects, it fails naming what is missing. Known to work: the codegen shipped
with every torch from 2.4 to 2.14 (reports/compat-matrix.md, scripts/compat_matrix.py).

Modes:
- ``fix``: emit and register ADInplaceOrView kernels for ops that mutate
  arguments and return nothing, bumping each written argument exactly once
  per call (read before the redispatch, bumped after it unless the backend
  already did), inside the existing template and shards; and add a
  regression test in PyTorch's style (``TEST_FILE``) that fails without the
  kernels and passes with them.
  In gen_variable_type.py (``VT_TARGET``): the VariableType kernels of out= ops
  that return nothing refuse inputs and outputs that require grad
  (``throw_error_out_requires_grad``), as those of out= ops that return
  something do.
- ``error``: make the codegen raise, listing every such op with its yaml
  line and kind (sorted by file and line), unless the op is on the allowlist
  the patch adds; in gen_variable_type.py, raise at the first out= op that
  returns nothing and is not on that file's allowlist.

The edited file stays as PyTorch's formatter (ruff format) wants it and gains
no ruff or mypy finding (tests/test_upstream_patch.py).
"""

from __future__ import annotations

import ast
import os

from ..errors import InputError
from . import codegen_test
from .edits import Insertion, apply_edits, new_file_diff
from .edits import inject as _inject
from .edits import unified_diff as _unified_diff


TARGET = "tools/autograd/gen_inplace_or_view_type.py"
VT_TARGET = "tools/autograd/gen_variable_type.py"
# The regression test `fix` adds, where PyTorch keeps its autograd tests (beside
# test_autograd_fallback.py); it depends on nothing but torch's own test utilities.
TEST_FILE = "test/test_autograd_inplace_or_view.py"
MARKER = "torchgen-patch"
KNOWN_GOOD = "torch 2.4 to 2.14"

FIX_HELPERS = _inject("fix_helpers.py.in")

FIX_BODY = _inject("fix_body.py.in")

FIX_DROP = _inject("fix_drop.py.in")

TEST_SOURCE = _inject("test_autograd_inplace_or_view.py.in")

ERROR_HELPERS = _inject("error_helpers.py.in")

ERROR_CALL = _inject("error_call.py.in")

VT_FIX = _inject("vt_fix.py.in")

VT_ERROR_HELPERS = _inject("vt_error_helpers.py.in")

VT_ERROR_CALL = _inject("vt_error_call.py.in")

# The statement of emit_body() (as ast.unparse prints it) before which the VariableType edit goes,
# and the names the edit reads (assigned in emit_body() before it).
VT_ANCHOR = "body.append(emit_call(f, unpacked_bindings, try_jit_decomposition))"
VT_NAMES = {"is_out_fn", "returns_void", "requires_derivative", "differentiable_inputs", "base_name"}

# The `if` test (as ast.unparse prints it) that drops ops with no returns.
DROP_TEST = "get_view_info(f) is None and (not modifies_arguments(f) or len(f.func.returns) == 0)"


def _function(tree: ast.Module, name: str, path: str) -> ast.FunctionDef:
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    raise _shape(path, f"function {name}() not found")


def _shape(path: str, what: str) -> InputError:
    return InputError(path, None, f"the codegen does not have the shape this patch expects: {what}",
                      f"known to work: {KNOWN_GOOD}")


def _indent(text: str, spaces: int) -> str:
    pad = " " * spaces
    return "".join(pad + line if line.strip() else line for line in text.splitlines(keepends=True))


def plan_edits(source: str, mode: str, path: str = TARGET) -> list[Insertion]:
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        raise InputError(path, e.lineno, f"not valid Python: {e.msg}") from None
    edits: list[Insertion] = []
    if mode == "fix":
        anchor = _function(tree, "modifies_arguments", path)
        edits.append(Insertion(anchor.end_lineno + 1,  # type: ignore[operator]  # ast.parse sets it
                               "\n\n" + FIX_HELPERS.strip("\n") + "\n"))
        for name in ("inplace_or_view_method_definition", "inplace_or_view_method_registration"):
            fn = _function(tree, name, path)
            ifs = [n for n in ast.walk(fn) if isinstance(n, ast.If) and ast.unparse(n.test) == DROP_TEST]
            if len(ifs) != 1:
                raise _shape(path, f"{name}() has no `if {DROP_TEST}:`")
            then = ifs[0].body
            if len(then) != 1 or ast.unparse(then[0]) != "return None":
                raise _shape(path, f"{name}(): `if {DROP_TEST}:` does not just `return None`")
            # the whole `if` is rewritten (same test, one more condition) rather than edited
            # in place, so that the file stays as PyTorch's formatter wants it
            edits.append(Insertion(ifs[0].lineno, _indent(FIX_DROP, ifs[0].col_offset),
                                   replaces=ifs[0].end_lineno  # type: ignore[operator]  # ast.parse sets it
                                   - ifs[0].lineno + 1))
        body = _function(tree, "emit_inplace_or_view_body", path)
        branch = [n for n in body.body if isinstance(n, ast.If) and ast.unparse(n.test) == "modifies_arguments(f)"]
        assigned = {t.id for n in body.body if isinstance(n, (ast.Assign, ast.AnnAssign))
                    for t in (n.targets if isinstance(n, ast.Assign) else [n.target]) if isinstance(t, ast.Name)}
        if len(branch) != 1 or not {"inplace_view_body", "redispatch_args"} <= assigned:
            raise _shape(path, "emit_inplace_or_view_body() has no `if modifies_arguments(f):` branch after "
                               "`inplace_view_body` and `redispatch_args`")
        edits.append(Insertion(branch[0].lineno, _indent(FIX_BODY, branch[0].col_offset)))
    elif mode == "error":
        anchor = _function(tree, "use_derived", path)
        edits.append(Insertion(anchor.end_lineno + 1,  # type: ignore[operator]  # ast.parse sets it
                               "\n\n" + ERROR_HELPERS.strip("\n") + "\n"))
        gen = _function(tree, "gen_inplace_or_view_type", path)
        if [a.arg for a in gen.args.args][3:4] != ["fns_with_infos"]:
            raise _shape(path, "gen_inplace_or_view_type() does not take `fns_with_infos` fourth")
        first = gen.body[0]
        edits.append(Insertion(first.lineno, _indent(ERROR_CALL, first.col_offset)))
    else:
        raise InputError(None, None, f"unknown --mode '{mode}'", "use 'fix' or 'error'")
    return edits


def plan_vt_edits(source: str, mode: str, path: str = VT_TARGET) -> list[Insertion]:
    """The edit of gen_variable_type.py: one whole statement inserted in emit_body() before the
    call is emitted (and, in mode error, the allowlist before emit_body())."""
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        raise InputError(path, e.lineno, f"not valid Python: {e.msg}") from None
    if mode not in ("fix", "error"):
        raise InputError(None, None, f"unknown --mode '{mode}'", "use 'fix' or 'error'")
    if not any(isinstance(n, ast.Assign) and [ast.unparse(t) for t in n.targets] == ["SETUP_NONE_REQUIRES_GRAD"]
               for n in tree.body):
        raise _shape(path, "no module-level SETUP_NONE_REQUIRES_GRAD template")
    body = _function(tree, "emit_body", path)
    anchor = [n for n in body.body if ast.unparse(n) == VT_ANCHOR]
    if len(anchor) != 1:
        raise _shape(path, f"emit_body() has no `{VT_ANCHOR}`")
    assigned = {t.id for n in body.body if isinstance(n, (ast.Assign, ast.AnnAssign)) and n.lineno < anchor[0].lineno
                for t in (n.targets if isinstance(n, ast.Assign) else [n.target]) if isinstance(t, ast.Name)}
    if not VT_NAMES <= assigned:
        raise _shape(path, f"emit_body() does not assign {', '.join(sorted(VT_NAMES - assigned))} before "
                           f"`{VT_ANCHOR}`")
    text = VT_FIX if mode == "fix" else VT_ERROR_CALL
    edits = [Insertion(anchor[0].lineno, _indent(text, anchor[0].col_offset))]
    if mode == "error":
        first = min([body.lineno] + [d.lineno for d in body.decorator_list])
        edits.append(Insertion(first, VT_ERROR_HELPERS.strip("\n") + "\n\n\n"))
    return edits


def state(source: str) -> str | None:
    """'fix' or 'error' when the file carries this patch, else None."""
    if "# torchgen-patch (fix)" in source:
        return "fix"
    if "# torchgen-patch (error)" in source:
        return "error"
    return None


def patched(source: str, mode: str, path: str = TARGET) -> str:
    applied = state(source)
    if applied is not None:
        raise InputError(path, None, f"already applied (mode {applied})", "nothing to do; `--check` reports it")
    return apply_edits(source, plan_edits(source, mode, path))


def unified_diff(old: str, new: str, rel: str = TARGET) -> str:
    return _unified_diff(old, new, rel)


def vt_patched(source: str, mode: str, path: str = VT_TARGET) -> str:
    if "# torchgen-patch (fix)" in source or "# torchgen-patch (error)" in source:
        raise InputError(path, None, "already applied", "nothing to do")
    return apply_edits(source, plan_vt_edits(source, mode, path))


def tree_diff(root: str, source: str, mode: str) -> str:
    """The whole diff for the checkout at ``root`` whose codegen reads ``source``: the codegen
    edits (gen_inplace_or_view_type.py, then gen_variable_type.py), the cases added to the
    codegen's own tests (tools/test/test_codegen.py) and, in mode fix, the regression test it adds."""
    from ..files import read_text

    text = unified_diff(source, patched(source, mode, os.path.join(root, TARGET)))
    vt_path = os.path.join(root, VT_TARGET)
    vt = read_text(vt_path, "the autograd codegen")
    text += unified_diff(vt, vt_patched(vt, mode, vt_path), VT_TARGET)
    text += codegen_test.diff(root, mode)
    if mode != "fix":
        return text
    test_path = os.path.join(root, TEST_FILE)
    if os.path.lexists(test_path):
        raise InputError(test_path, None, "already exists; the fix adds this test",
                         "remove it, or apply the codegen change by hand")
    return text + new_file_diff(TEST_SOURCE, TEST_FILE)
