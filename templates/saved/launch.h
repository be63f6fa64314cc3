// The saved-tensor check's launches of its fingerprint kernels (cuda_launch.cpp): one tensor's, or a batch's
// of the tensors a node saved.

#pragma once

#include "cuda.h"
#include "fingerprint.h"

#include <string>
#include <utility>
#include <vector>

namespace torchgen_patch_saved __attribute__((visibility("hidden"))) {

// What launch() says when it launches nothing: a graph is being captured, or a layout its kernels do not read
// (more than 8 strided dimensions, elements not aligned to their size: the Python path reads those).
inline const std::string kCaptured = "saved while a CUDA graph was captured";
inline const std::string kLayoutChanged = "a layout the kernels do not read";

using Streams = std::vector<std::pair<c10::Device, CUstream>>;  // the streams comparisons ran on, with their devices

// How the kernels read a tensor: one tensor of a batch, and the arguments of its own launch (the CUDA Item).
struct Item {
  const unsigned char* base = nullptr;
  u64 nbytes = 0;
  int64_t numel = 0;
  u64* slot = nullptr;
  const u64* expect = nullptr;
  u64 record = 0;
  u32 first = 0, blocks = 0;  // its blocks of threads (first: where they start in a batch)
  int kind = 0;               // 0 dense, 1 rows, 2 strided
  int small = 0;              // rows: 32-bit offsets
  Layout l;
};
constexpr int kBatch = 16;  // the CUDA MAX_BATCH
struct Batch {
  Item item[kBatch];
  int n = 0;
};
static_assert(sizeof(Item) == 200 && sizeof(Batch) == 3208, "Item and Batch are the CUDA kernel's");

// t's reading into a fresh slot (out), comparing against expect where given: an empty string, or why not.
// `batched`: a tensor of a batch (its blocks of threads capped by the batch kernel's), else one launch's.
std::string item_of(const at::Tensor& t, DeviceState& s, DeviceFingerprint& out, const u64* expect, u64 record,
                    Item& it, bool batched);

// Whether a graph is being captured on stream (the legacy default stream, null, never is).
bool capturing(CUstream stream);

extern int64_t launches;  // the fingerprint kernel's launches in this process (each tensor's, each batch's)
extern std::string launch_error;  // the last launch's that failed

// Launch the fingerprint of t into a fresh slot; with expect, the launch also compares against it and
// flags record in host memory if they differ. An empty string: launched; else why not.
std::string launch(const at::Tensor& t, DeviceState& s, DeviceFingerprint& out, const u64* expect, u64 record,
                   Streams* streams);

// One launch of b's readings (made by item_of on device, whose current stream is stream).
std::string launch_batch(DeviceState& s, const at::Device& device, CUstream stream, Batch& b, Streams* streams);

}  // namespace torchgen_patch_saved
