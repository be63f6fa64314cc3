"""A program for `torchgen-patch run` tests: reports whether the patch is active in its
process and what the seed op does to the version counters; exits with $PROBE_EXIT."""

import os
import sys

import torch

import torchgen_patch

x = torch.arange(4.0)
outs = [torch.empty(2), torch.empty(2)]
torch.split_with_sizes_copy(x, [2, 2], out=outs)
rank = os.environ.get("RANK")
if rank is not None:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    t = torch.ones(1)
    dist.all_reduce(t)
    dist.destroy_process_group()
# one write per line: ranks share the pipe, and print() writes the text and the newline apart
sys.stdout.write(f"probe rank={rank} active={len(torchgen_patch.installed_ops())} "
                 f"versions={outs[0]._version},{outs[1]._version}\n")
sys.stdout.flush()
sys.exit(int(os.environ.get("PROBE_EXIT", "0")))
