"""An extension module that prints on import (as some do) and defines a mutating
operator with torch.library.define, whose library torch creates inside
torch/library.py: the operator's location must be the define call below."""

import torch

print("noisy_ops: a note printed to stdout on import")

torch.library.define("tgp_noisy::write", "(Tensor x, Tensor(a!) out) -> ()")  # DEFINE-LINE


@torch.library.impl("tgp_noisy::write", "CPU")
def _write(x, out):
    with torch.autograd._unsafe_preserve_version_counter(out):
        out.copy_(x)
