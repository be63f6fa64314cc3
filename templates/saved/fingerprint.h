// The saved-tensor check's key and CPU fingerprint (fingerprint.cpp), and the layout of a strided tensor
// the CUDA kernels read as well.

#pragma once

#include "common.h"

#include <ATen/core/Tensor.h>

namespace torchgen_patch_saved __attribute__((visibility("hidden"))) {

struct Key {
  u32 nh[kWords];
  u64 seed;
};
extern Key key;
extern bool keyed;  // set_key was called

extern const char* nh_name;  // what the CPU fingerprint runs on: "avx2" or "scalar"
void choose_nh();

// The fingerprint of nbytes of memory at p, read in place (the last partial block copied and padded).
u64 fingerprint_block(const unsigned char* p, int64_t nbytes);

struct Layout {
  int64_t size[kMaxDims];
  int64_t stride[kMaxDims];  // elements
  int dims = 0;
  int element = 0;
};

// t's dimensions by decreasing stride, merged where contiguous; false where more than kMaxDims remain.
bool collapse(const at::Tensor& t, Layout& l);

// The fingerprint of a tensor whose elements leave gaps: its elements in l's order (by decreasing stride).
u64 fingerprint_strided(const unsigned char* base, const Layout& l, int64_t numel);

// Whether t's elements fill one block of memory exactly, in some order of its dimensions.
bool dense(const at::Tensor& t);

// Every element lies inside the storage (a storage resized to 0 between uses, as FSDP does, is not).
bool readable(const at::Tensor& t);

}  // namespace torchgen_patch_saved
