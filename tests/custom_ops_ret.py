"""Custom operators that write an argument and also return something (a Tensor,
a tuple, a list), as extension libraries' ops do; backends that do not bump."""

import torch

from testbed.custom_ops import quiet_copy

lib = torch.library.Library("tgp_ret", "DEF")
lib.define("one(Tensor x, Tensor(a!) out) -> Tensor")
lib.define("pair(Tensor x, Tensor(a!) out) -> (Tensor, Tensor)")
lib.define("many(Tensor x, Tensor(a!) out) -> Tensor[]")


def one(x, out):
    quiet_copy(out, x)
    return x * 2


def pair(x, out):
    quiet_copy(out, x)
    return x * 2, x * 3


def many(x, out):
    quiet_copy(out, x)
    return [x * 2, x * 3, x * 4]


for _key in ("CPU", "CUDA"):
    lib.impl("one", one, _key)
    lib.impl("pair", pair, _key)
    lib.impl("many", many, _key)
