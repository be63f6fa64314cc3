"""Build small native_functions.yaml fixtures from the installed torchgen's own
yaml (so they follow whatever torch is installed), plus synthetic entries."""

from __future__ import annotations

import os
import re

from tests.support import packaged_yaml

# Representative ops for the goldens: one of each family.
GOLDEN_FUNCS = [
    "_cummax_helper",
    "_cummin_helper",
    "_foreach_add.Scalar",
    "_foreach_add_.Scalar",
    "_fused_adam_",
    "split_with_sizes_copy",
    "split_with_sizes_copy.out",
    "add.Tensor",
    "add_.Tensor",
    "add.out",
]

# torch has no op that writes an optional tensor and returns nothing. The golden
# fixture edits _cummin_helper so that its 'indices' is optional: a synthetic
# entry that only exercises the codegen (torchgen allows this name to have no
# out= variant, so the edited schema parses).
OPTIONAL_EDIT = ("_cummin_helper(Tensor self, Tensor(a!) values, Tensor(b!) indices, int dim) -> ()",
                 "_cummin_helper(Tensor self, Tensor(a!) values, Tensor(b!)? indices, int dim) -> ()")


def entries(text: str) -> dict[str, str]:
    """Each top-level '- func:' block of a native_functions.yaml, by func name."""
    blocks: dict[str, str] = {}
    starts = [m.start() for m in re.finditer(r"^- func:", text, re.M)] + [len(text)]
    for a, b in zip(starts, starts[1:], strict=False):
        block = text[a:b]
        name = block.split("\n", 1)[0][len("- func:"):].strip().split("(", 1)[0]
        blocks[name] = block.rstrip() + "\n"
    return blocks


def subset_yaml(dir_: str, funcs: list[str], edits: tuple[tuple[str, str], ...] = ()) -> tuple[str, str]:
    native, tags = packaged_yaml()
    blocks = entries(open(native, encoding="utf-8").read())
    text = "".join(blocks[f] + "\n" for f in funcs)
    for old, new in edits:
        assert old in text, f"fixture edit does not apply: {old}"
        text = text.replace(old, new)
    out = os.path.join(dir_, "native_functions.yaml")
    with open(out, "w", encoding="utf-8") as fh:
        fh.write(text)
    tags_out = os.path.join(dir_, "tags.yaml")
    with open(tags_out, "w", encoding="utf-8") as fh:
        fh.write(open(tags, encoding="utf-8").read())
    return out, tags_out


def golden_yaml(dir_: str) -> tuple[str, str]:
    return subset_yaml(dir_, GOLDEN_FUNCS, (OPTIONAL_EDIT,))
