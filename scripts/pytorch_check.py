"""The release check's entry point (the check itself: the package release_check/ beside this file).

    python scripts/pytorch_check.py                           # every step -> build/pytorch-own-<release>.{md,json}
    python scripts/pytorch_check.py --report                  # the same, into reports/ and docs/release-check.md
    python scripts/pytorch_check.py --only test_torch.py      # one step (or test group) again, merged into the results
    python scripts/pytorch_check.py --render-only --report    # re-render from the json

docs/release-check.md says what each step does.
"""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "scripts"))

from release_check.main import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
