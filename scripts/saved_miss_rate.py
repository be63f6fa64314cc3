"""How often the saved-tensor check's fingerprint misses a change, measured where it can be: the
fingerprint reduced to a residue mod 1021 (10 bits) misses a random change of three elements about
once in 1021 if the full 64-bit value mixes like a uniform hash (docs/unseen-writes.md quotes this
script's output; the bound for any change chosen without the process's key is NH's, 2**-32).

    .venv/bin/python scripts/saved_miss_rate.py [--changes N]
"""

from __future__ import annotations

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def misses(path: str, size: int, changes: int, modulus: int = 1021, seed: int = 0) -> int:
    import numpy as np
    import torch

    from torchgen_patch.saved import fingerprint as fp

    fp._FORCE_DEVICE_PATH = path == "device"
    try:
        rng = np.random.default_rng(seed)
        base = torch.from_numpy(rng.standard_normal(size).astype(np.float32))
        ref = int(fp.fingerprint(base)[0]) % modulus
        n = 0
        for _ in range(changes):
            t = base.clone()
            t[rng.integers(0, size, 3)] = torch.from_numpy(rng.standard_normal(3).astype(np.float32))
            n += int(fp.fingerprint(t)[0]) % modulus == ref
        return n
    finally:
        fp._FORCE_DEVICE_PATH = False


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--changes", type=int, default=20000)
    a = p.parse_args(argv)
    sys.path.insert(0, ROOT)
    for path, size, what in (("numpy", 256, "one NH block (1 KiB), numpy"),
                             ("numpy", 8192, "32 NH blocks (32 KiB), numpy"),
                             ("device", 8192, "32 NH blocks, torch's ops (run on CPU)")):
        n = misses(path, size, a.changes)
        print(f"{what}: {n} misses in {a.changes} changes, mod 1021 (a uniform hash: {a.changes / 1021:.1f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
