"""A program that sets torch's import-time settings itself, before its own `import torch`, and
prints what torch made of them (one JSON line); with the argument `abort` it then aborts the way
PyTorch's own TestTorch.test_terminate_handler_on_crash does, so the crash handler the setting
installs must speak. The same output with and without `torchgen-patch run` is the test."""

import json
import os
import sys

os.environ["OMP_NUM_THREADS"] = "1"
os.environ["TORCH_CUSTOM_TERMINATE"] = "1"

import torch  # noqa: E402
import torch._C  # noqa: E402

sys.stdout.write(json.dumps({"threads": torch.get_num_threads(), "interop_threads": torch.get_num_interop_threads()})
                 + "\n")
sys.stdout.flush()
if sys.argv[1:] == ["abort"]:
    torch._C._abort()
