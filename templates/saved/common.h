// The saved-tensor check's native hooks: what every part of them shares.
//
// The saved-tensor check's hot path: the pack and unpack hooks autograd calls for every saved tensor,
// as a Python extension type (torchgen_patch/saved/native.py loads it; hooks.py composes it).
//
// pack(t): the version, whether t is a leaf or an output of the node being made, a fingerprint of its
// bytes (CPU: here, vectorized, on torch's intra-op threads; CUDA: one kernel launched on the current
// stream, its result left in a device slot), its data pointer, the optimizer step count, and the
// program's frame (code object and instruction, no strings). unpack: the version again (moved: the
// Python side raises autograd's own error), the fingerprint again (CPU: compared at once; CUDA: one
// kernel for all the tensors the node saved, at the first of them it unpacks, that compares on the device
// and flags a change in host memory, read once at the end of the backward pass). Everything a finding
// needs beyond that is resolved in Python, only when one is made.
//
// The parts, each a translation unit of the library (torchgen_patch/codegen/render.py reads this folder):
//   fingerprint.cpp   the key and the CPU fingerprint (fingerprint.h)
//   cuda_driver.cpp   the CUDA driver and NVRTC, looked up at run time; each device's kernels and slots (cuda.h)
//   cuda_launch.cpp   the fingerprint kernels' launches (launch.h)
//   records.cpp       what the check keeps of a saved tensor: the Packed type, the program's frames (records.h)
//   pack.cpp          the pack hook
//   pending.cpp       the device comparisons a backward pass keeps until its end
//   unpack.cpp        the unpack hook, and its batched launch of a node's saved tensors
//   backward_end.cpp  the end of a backward pass: one read of its device comparisons
//   module.cpp        the Hooks type's methods and the module (its one exported symbol)
//   torch_python.cpp  torch's Python objects (tensors, nodes, devices, dtypes): the one part that includes
//                     torch's Python bindings (torch_python.h)
// hooks.h declares what the hooks' parts call of one another. fingerprint.cu is the kernels' CUDA source,
// handed to NVRTC at run time (torchgen_patch/runtime/checklib.py), never compiled here.
// Everything lives in one namespace of hidden visibility: the library exports torchgen_patch_saved_module
// (and the build statement every library of this tool has) and nothing else.

#pragma once

#include <cstdint>

namespace torchgen_patch_saved __attribute__((visibility("hidden"))) {

using u32 = uint32_t;
using u64 = uint64_t;

constexpr int kWords = 256;                  // 32-bit words in an NH block
constexpr int64_t kBlockBytes = kWords * 4;  // 1 KiB
constexpr int kMaxDims = 8;

}  // namespace torchgen_patch_saved
