"""Upstream: a patch for PyTorch's own autograd codegen (``diff``)."""
