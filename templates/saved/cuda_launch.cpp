// The saved-tensor check's launches of its fingerprint kernels: a tensor's layout read into the arguments
// of the dense, rows or strided kernel, launched on the current stream (or as one of a batch).

#include "launch.h"

#include <algorithm>

namespace torchgen_patch_saved __attribute__((visibility("hidden"))) {

// Whether the rows kernel reads l: its innermost dimension contiguous, each row a multiple of 16 bytes long
// and starting at a multiple of 16 (so every 16 bytes of the stream lie in one row, aligned).
static bool in_rows(const Layout& l, u64 ptr) {
  const int64_t e = l.element;
  if (l.stride[l.dims - 1] != 1 || (l.size[l.dims - 1] * e) % 16 || ptr % 16) return false;
  for (int d = 0; d < l.dims - 1; ++d)
    if ((l.stride[d] * e) % 16) return false;
  return true;
}

// t's reading into a fresh slot (out), comparing against expect where given: an empty string, or why not.
// `batched`: a tensor of a batch (its blocks of threads capped by the batch kernel's), else one launch's.
std::string item_of(const at::Tensor& t, DeviceState& s, DeviceFingerprint& out, const u64* expect, u64 record,
                    Item& it, bool batched) {
  const bool is_dense = dense(t);
  if (!is_dense && !collapse(t, it.l)) return kLayoutChanged;
  const int64_t e = t.element_size();
  const u64 ptr = (u64)(uintptr_t)t.const_data_ptr();
  if (!is_dense && ptr % (u64)std::min<int64_t>(e, 4)) return kLayoutChanged;
  slot_on(s, t.device(), out);
  it.base = reinterpret_cast<const unsigned char*>(ptr);
  it.numel = t.numel();
  it.nbytes = (u64)(it.numel * e);
  it.slot = out.address();
  it.expect = expect;
  it.record = record;
  const u64 words = (it.nbytes + 3) / 4;
  const u64 blocks = (words + kWords - 1) / kWords;
  it.kind = is_dense ? 0 : in_rows(it.l, ptr) ? 1 : 2;
  // a block of threads (8 warps) for each 8 KiB, as many as are resident at once: a small tensor is read by
  // many warps, one NH block each (a tensor of at most 8 KiB by one block of threads, which adds no other's
  // total); a large one by every warp resident, four NH blocks a turn
  it.blocks = (u32)std::min<u64>(std::max<u64>((blocks + 7) / 8, 1), s.cap[batched ? 3 : it.kind]);
  if (it.kind == 1) {
    int64_t reach = 0;  // the largest element offset: 32-bit arithmetic only where it and the count fit
    for (int d = 0; d < it.l.dims; ++d) reach += (it.l.size[d] - 1) * it.l.stride[d];
    it.small = it.numel < (int64_t(1) << 31) && reach < (int64_t(1) << 31) ? 1 : 0;
  }
  return "";
}

// Whether a graph is being captured on stream (the legacy default stream, null, never is).
bool capturing(CUstream stream) {
  int on = 0;
  return stream && cuda.cu.streamIsCapturing(stream, &on) == 0 && on;
}

static void used_stream(Streams* streams, const at::Device& device, CUstream stream) {
  auto used = std::make_pair(device, stream);
  if (streams && std::find(streams->begin(), streams->end(), used) == streams->end()) streams->push_back(used);
}

int64_t launches = 0;  // the fingerprint kernel's launches in this process (each tensor's, each batch's)
std::string launch_error;  // the last launch's that failed

std::string launch(const at::Tensor& t, DeviceState& s, DeviceFingerprint& out, const u64* expect, u64 record,
                   Streams* streams) {
  const at::Device device = t.device();
  OnDevice guard(device);
  CUstream stream = current_stream(device);
  if (capturing(stream)) return kCaptured;
  Item it;
  std::string why = item_of(t, s, out, expect, record, it, false);
  if (!why.empty()) return why;
  void* key_ptr = s.key.data_ptr();
  u64 seed = key.seed, cap = kFlags;
  void* flags = cuda.flags;
  void* any = const_cast<u32*>(cuda.any);
  CUresult r;
  if (it.kind == 0) {
    void* args[] = {(void*)&it.base, (void*)&it.nbytes, &key_ptr, &seed, (void*)&it.slot, (void*)&it.expect,
                    (void*)&it.record, &flags, &cap, &any};
    r = cuda.cu.launchKernel(s.dense, it.blocks, 1, 1, 256, 1, 1, 0, stream, args, nullptr);
  } else if (it.kind == 1) {
    void* args[] = {(void*)&it.base, &it.l, (void*)&it.nbytes, &it.small, &key_ptr, &seed, (void*)&it.slot,
                    (void*)&it.expect, (void*)&it.record, &flags, &cap, &any};
    r = cuda.cu.launchKernel(s.rows, it.blocks, 1, 1, 256, 1, 1, 0, stream, args, nullptr);
  } else {
    void* args[] = {(void*)&it.base, &it.l, (void*)&it.numel, &key_ptr, &seed, (void*)&it.slot, (void*)&it.expect,
                    (void*)&it.record, &flags, &cap, &any};
    r = cuda.cu.launchKernel(s.strided, it.blocks, 1, 1, 256, 1, 1, 0, stream, args, nullptr);
  }
  if (r) return launch_error = "the fingerprint kernel did not launch: " + cu_error(r);
  ++launches;
  used_stream(streams, device, stream);
  return "";
}

// One launch of b's readings (made by item_of on device, whose current stream is stream).
std::string launch_batch(DeviceState& s, const at::Device& device, CUstream stream, Batch& b, Streams* streams) {
  u32 first = 0;
  for (int i = 0; i < b.n; ++i) {
    b.item[i].first = first;
    first += b.item[i].blocks;
  }
  void* key_ptr = s.key.data_ptr();
  u64 seed = key.seed, cap = kFlags;
  void* flags = cuda.flags;
  void* any = const_cast<u32*>(cuda.any);
  void* args[] = {(void*)&b, &key_ptr, &seed, &flags, &cap, &any};
  CUresult r = cuda.cu.launchKernel(s.batch, first, 1, 1, 256, 1, 1, 0, stream, args, nullptr);
  if (r) return launch_error = "the fingerprint kernel did not launch: " + cu_error(r);
  ++launches;
  used_stream(streams, device, stream);
  return "";
}

}  // namespace torchgen_patch_saved
