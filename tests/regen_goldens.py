"""Regenerate the golden files under tests/golden/ (`make goldens`).

The goldens are the codegen's output for a small yaml made from the installed
torch's own entries (tests/yaml_fixtures.py), plus one kernel file per op.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
GOLDEN = os.path.join(HERE, "golden")


def render_goldens() -> dict[str, bytes]:
    sys.path.insert(0, os.path.dirname(HERE))
    from tests.yaml_fixtures import golden_yaml
    from tests.support import scan_of
    from torchgen_patch.codegen.render import environment, render
    from torchgen_patch.plan import make_plan
    from torchgen_patch.plan.overlay import empty

    with tempfile.TemporaryDirectory() as d:
        native, tags = golden_yaml(d)
        plan = make_plan(scan_of(native, tags, cache=False), empty())
    files = {k: v for k, v in render(plan, 1).items() if k != "ADInplaceOrViewPatchEverything.cpp"}
    env = environment()
    for k in plan.kernels:
        files[f"kernels/{k.name}.cpp"] = env.get_template(k.template).render(k=k).encode()
    return files


def main() -> int:
    files = render_goldens()
    if os.path.isdir(GOLDEN):
        shutil.rmtree(GOLDEN)
    for name, data in files.items():
        path = os.path.join(GOLDEN, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as fh:
            fh.write(data)
    print(f"wrote {len(files)} golden files to {os.path.relpath(GOLDEN)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
