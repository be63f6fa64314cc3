"""Custom operators (``tgp_test::*``) for the runtime tests and the start-up benchmark, defined the
way extensions define them (torch.library.Library(...).define), with backend kernels that write
without bumping, like FSDP2's split_with_sizes_copy. Importing the module defines them."""

import torch

NS = "tgp_test"
lib = torch.library.Library(NS, "DEF")
lib.define("write_one(Tensor x, Tensor(a!) out) -> ()")
lib.define("write_list(Tensor x, Tensor(a!)[] out) -> ()")
lib.define("write_opt(Tensor x, Tensor(a!)? out=None) -> ()")
lib.define("read_only(Tensor x) -> Tensor")


def quiet_copy(dst, src):
    """``dst.copy_(src)`` with ``dst``'s version left where it was (a backend kernel that does not bump)."""
    with torch.autograd._unsafe_preserve_version_counter(dst):
        dst.copy_(src)


def write_one(x, out):
    quiet_copy(out, x)


def write_list(x, out):
    for t in out:
        quiet_copy(t, x)


def write_opt(x, out=None):
    if out is not None:
        quiet_copy(out, x)


def read_only(x):
    return x.clone()


for _key in ("CPU", "CUDA"):
    lib.impl("write_one", write_one, _key)
    lib.impl("write_list", write_list, _key)
    lib.impl("write_opt", write_opt, _key)
    lib.impl("read_only", read_only, _key)
