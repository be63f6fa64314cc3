"""The cases the upstream diff adds to PyTorch's codegen tests (``tools/test/test_codegen.py``).

PyTorch's reviewers of ``tools/autograd`` judge a codegen change by a test of that file's kind: a
``NativeFunction`` built from a schema string, and assertions on the definition the codegen emits
for it. ``fix`` adds a class whose cases build a zero-returns ``out=`` operator, a ``_foreach_*_``
and a ``_fused_*_`` operator and assert each gets an ADInplaceOrView kernel that bumps every
written argument (and no read one); ``error`` adds one that asserts the codegen's message.

The class goes after the file's last class, and the names it uses are added to the file's own
imports (merged into an existing ``from M import ...``, else a new line in the module's place); a
tree without the file (one assembled from a wheel, which ships no ``tools/test/``) gets a new file
holding only these cases.
"""

from __future__ import annotations

import ast
import os

from ..errors import InputError
from .edits import Insertion, apply_edits, inject, new_file_diff, unified_diff

CODEGEN_TEST = "tools/test/test_codegen.py"
CASES = {"fix": inject("test_codegen_fix.py.in"), "error": inject("test_codegen_error.py.in")}
# module -> the names the cases use from it
IMPORTS = {
    "tools.autograd": ("gen_inplace_or_view_type",),
    "torchgen.api.autograd": ("NativeFunctionWithDifferentiabilityInfo",),
    "torchgen.model": ("Location", "NativeFunction"),
}
LINE = 88  # PyTorch's formatter's line length


def _render_import(module: str, names: list[str]) -> str:
    names = sorted(set(names), key=lambda n: (n.lower(), n))
    one = f"from {module} import {', '.join(names)}\n"
    if len(one) - 1 <= LINE:
        return one
    return f"from {module} import (\n" + "".join(f"    {n},\n" for n in names) + ")\n"


def _import_edits(tree: ast.Module, path: str) -> list[Insertion]:
    froms = [n for n in tree.body if isinstance(n, ast.ImportFrom) and n.level == 0 and n.module]
    edits = []
    for module, wanted in IMPORTS.items():
        same = [n for n in froms if n.module == module]
        if same:
            have = [a.name for a in same[0].names]
            if any(a.asname for a in same[0].names) or any(a.name == "*" for a in same[0].names):
                raise InputError(path, same[0].lineno, f"`from {module} import` renames or stars: the cases "
                                 "cannot be added to it")
            if set(wanted) <= set(have):
                continue
            end = same[0].end_lineno or same[0].lineno
            edits.append(Insertion(same[0].lineno, _render_import(module, have + list(wanted)),
                                   replaces=end - same[0].lineno + 1))
            continue
        package = module.split(".")[0]
        kin = [n for n in froms if (n.module or "").split(".")[0] == package]
        after = [n for n in kin if (n.module or "").lower() > module.lower()]
        if after:
            edits.append(Insertion(after[0].lineno, _render_import(module, list(wanted))))
        elif kin:
            edits.append(Insertion((kin[-1].end_lineno or kin[-1].lineno) + 1, _render_import(module, list(wanted))))
        else:
            raise InputError(path, None, f"imports nothing from `{package}`: the cases cannot be added",
                             "add them by hand")
    return edits


def edited(source: str, mode: str, path: str = CODEGEN_TEST) -> str:
    """``source`` (the tree's test_codegen.py) with the mode's cases and their imports added."""
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        raise InputError(path, e.lineno, f"not valid Python: {e.msg}") from None
    classes = [n for n in tree.body if isinstance(n, ast.ClassDef)]
    if not classes:
        raise InputError(path, None, "defines no test class: the cases cannot be added after one")
    if any(c.name == "TestGenInplaceOrViewType" for c in classes):
        raise InputError(path, None, "already has TestGenInplaceOrViewType", "nothing to do")
    edits = _import_edits(tree, path)
    edits.append(Insertion((classes[-1].end_lineno or classes[-1].lineno) + 1, "\n\n" + CASES[mode]))
    return apply_edits(source, edits)


def new_file(mode: str) -> str:
    """The whole file, for a tree that has none: the imports the cases use, the cases, the runner."""
    imports = "".join(_render_import(m, list(n)) + ("\n" if m == "tools.autograd" else "")
                      for m, n in IMPORTS.items())
    return ("from __future__ import annotations\n\nimport unittest\n\n" + imports + "\n\n" + CASES[mode]
            + '\n\nif __name__ == "__main__":\n    unittest.main()\n')


def diff(root: str, mode: str) -> str:
    """The diff of ``tools/test/test_codegen.py`` in the checkout at ``root``."""
    from ..files import read_text

    path = os.path.join(root, CODEGEN_TEST)
    if not os.path.lexists(path):
        return new_file_diff(new_file(mode), CODEGEN_TEST)
    source = read_text(path, "the codegen tests")
    return unified_diff(source, edited(source, mode, path), CODEGEN_TEST)
