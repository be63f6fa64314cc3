"""Issue 2: `lint` over the full yaml against torchgen's parse_native_yaml alone.

Both sides run in a fresh interpreter and time themselves from before their
first import to the end (the interpreter's own start-up is excluded from both).
Cold: an empty cache directory. Warm: a re-run on unchanged inputs (cache hit).
"""

from __future__ import annotations

import tempfile

from common import paired, ratio_line, run_py

PARSE = """
import time; t = time.perf_counter()
from torchgen.gen import parse_native_yaml
from torchgen_patch.tg import packaged_yaml
n, tags = packaged_yaml()
parse_native_yaml(n, tags)
print(time.perf_counter() - t)
"""

LINT = """
import time, io, contextlib; t = time.perf_counter()
from torchgen_patch.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    main(["lint"])
print(time.perf_counter() - t)
"""


def main(n: int = 7) -> list[dict]:
    def cold():
        return run_py(LINT, {"TORCHGEN_PATCH_CACHE": tempfile.mkdtemp(prefix="tgp-cold-")})

    warm_dir = tempfile.mkdtemp(prefix="tgp-warm-")
    run_py(LINT, {"TORCHGEN_PATCH_CACHE": warm_dir})  # fill the cache once

    def warm():
        return run_py(LINT, {"TORCHGEN_PATCH_CACHE": warm_dir})

    def parse():
        return run_py(PARSE)

    out = []
    xs, ys = paired(cold, parse, n)
    out.append(ratio_line("lint cold vs parse_native_yaml", xs, ys, 1.2))
    xs, ys = paired(warm, parse, n)
    out.append(ratio_line("lint re-run (cache hit) vs parse_native_yaml", xs, ys, 0.1))
    return out


if __name__ == "__main__":
    main()
