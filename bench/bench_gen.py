"""Issue 3: `gen` over the full yaml against the upstream autograd codegen run
from the wheel, side by side (interleaved runs, fresh interpreters both)."""

from __future__ import annotations

import shutil
import sys
import tempfile

from common import ROOT, paired, ratio_line, wall

sys.path.insert(0, ROOT)
from torchgen_patch.sources import Options, resolve  # noqa: E402


def main(n: int = 3) -> list[dict]:
    src = resolve(Options())
    native, tags, autograd = src.native, src.tags, src.toolchain.autograd_dir

    def upstream():
        out = tempfile.mkdtemp(prefix="tgp-up-")
        try:
            return wall([sys.executable, "-m", "torchgen.packaged.autograd.gen_autograd", native, tags, out, autograd])
        finally:
            shutil.rmtree(out, ignore_errors=True)

    def cold():
        out = tempfile.mkdtemp(prefix="tgp-gen-")
        cache = tempfile.mkdtemp(prefix="tgp-cache-")
        try:
            return wall([sys.executable, "-m", "torchgen_patch", "gen", "--out", out, "--quiet"],
                        {"TORCHGEN_PATCH_CACHE": cache})
        finally:
            shutil.rmtree(out, ignore_errors=True)
            shutil.rmtree(cache, ignore_errors=True)

    warm_out = tempfile.mkdtemp(prefix="tgp-gen-warm-")
    warm_cache = tempfile.mkdtemp(prefix="tgp-cache-warm-")
    env = {"TORCHGEN_PATCH_CACHE": warm_cache}
    wall([sys.executable, "-m", "torchgen_patch", "gen", "--out", warm_out, "--quiet"], env)

    def nochange():
        return wall([sys.executable, "-m", "torchgen_patch", "gen", "--out", warm_out, "--quiet"], env)

    out = []
    xs, ys = paired(cold, upstream, n)
    out.append(ratio_line("gen cold vs upstream gen_autograd", xs, ys, 0.25))
    xs, ys = paired(nochange, upstream, n)
    out.append(ratio_line("gen no-change re-run vs upstream gen_autograd", xs, ys, 0.1))
    return out


if __name__ == "__main__":
    main()
