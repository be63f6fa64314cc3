"""What the tests, the benchmarks and the scripts share, standing on its own (none of it imports
``tests``): checkout-layout trees assembled from torch wheels (``trees``) and the installed torch's
codegen run in one (``upstream_tree``), PyTorch's source from Debian (``debian_source``, used only as
``release_inputs`` vouches for it), a venv without torch and the tool's console script in it
(``notorch_venv``), where FSDP2 lives (``fsdp``), custom operators defined as extensions define them
(``custom_ops``), the extension libraries' optimizers and embeddings as they are driven (``ecosystem``),
and how a gloo rank is judged at exit (``ranks``). Never shipped: the wheel holds ``torchgen_patch``
only."""
