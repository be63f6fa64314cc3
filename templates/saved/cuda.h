// The CUDA side of the saved-tensor check, host part: the driver API and NVRTC looked up at run time (no CUDA
// headers, no nvcc), each device's compiled kernels, and the device slots the kernels write their sums into
// (cuda_driver.cpp).

#pragma once

#include "common.h"

#include <ATen/core/Tensor.h>
#include <c10/core/DeviceGuard.h>

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace torchgen_patch_saved __attribute__((visibility("hidden"))) {

using CUresult = int;
using CUdevice = int;
using CUmodule = void*;
using CUcontext = void*;
using CUevent = void*;
using CUfunction = void*;
using CUstream = void*;
using nvrtcProgram = void*;

struct Driver {
  CUresult (*moduleLoadData)(CUmodule*, const void*) = nullptr;
  CUresult (*moduleGetFunction)(CUfunction*, CUmodule, const char*) = nullptr;
  CUresult (*launchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                           CUstream, void**, void**) = nullptr;
  CUresult (*streamSynchronize)(CUstream) = nullptr;
  CUresult (*streamIsCapturing)(CUstream, int*) = nullptr;
  CUresult (*memHostAlloc)(void**, size_t, unsigned) = nullptr;
  CUresult (*deviceGetAttribute)(int*, int, CUdevice) = nullptr;
  CUresult (*getErrorString)(CUresult, const char**) = nullptr;
  CUresult (*memAlloc)(u64*, size_t) = nullptr;
  CUresult (*memsetD32Async)(u64, unsigned, size_t, CUstream) = nullptr;
  CUresult (*memcpyDtoH)(void*, u64, size_t) = nullptr;
  CUresult (*eventCreate)(CUevent*, unsigned) = nullptr;
  CUresult (*eventRecord)(CUevent, CUstream) = nullptr;
  CUresult (*eventQuery)(CUevent) = nullptr;
  CUresult (*eventSynchronize)(CUevent) = nullptr;
  CUresult (*deviceGet)(CUdevice*, int) = nullptr;
  CUresult (*primaryCtxRetain)(CUcontext*, CUdevice) = nullptr;
  CUresult (*ctxGetCurrent)(CUcontext*) = nullptr;
  CUresult (*ctxSetCurrent)(CUcontext) = nullptr;
  CUresult (*occupancy)(int*, CUfunction, int, size_t) = nullptr;
};
constexpr CUresult kNotReady = 600;  // CUDA_ERROR_NOT_READY: an event whose work has not all run yet

struct Nvrtc {
  int (*create)(nvrtcProgram*, const char*, const char*, int, const char* const*, const char* const*) = nullptr;
  int (*compile)(nvrtcProgram, int, const char* const*) = nullptr;
  int (*ptxSize)(nvrtcProgram, size_t*) = nullptr;
  int (*ptx)(nvrtcProgram, char*) = nullptr;
  int (*cubinSize)(nvrtcProgram, size_t*) = nullptr;
  int (*cubin)(nvrtcProgram, char*) = nullptr;
  int (*logSize)(nvrtcProgram, size_t*) = nullptr;
  int (*log)(nvrtcProgram, char*) = nullptr;
  int (*destroy)(nvrtcProgram*) = nullptr;
  int (*numArchs)(int*) = nullptr;
  int (*archs)(int*) = nullptr;
};

constexpr int64_t kSlots = 1 << 16;

// 64K slots of two words (a launch's sum, its blocks of threads done) in device memory of the check's own,
// never the caching allocator's: a buffer whose last record is gone waits in `retired` until the next read
// at the end of a backward pass has waited for every stream that used it, is zeroed there, and is used again.
struct SlotBuffer {
  u64 address = 0;
  int device = -1;
};

struct DeviceState {
  bool tried = false;
  CUcontext context = nullptr;  // the device's primary context (torch's), retained for the process
  std::string why;  // why the kernel is not used on this device (empty: it is)
  CUfunction dense = nullptr, strided = nullptr, rows = nullptr, batch = nullptr;
  at::Tensor key;  // the NH key on the device (256 words)
  std::shared_ptr<SlotBuffer> current;  // slots handed out in order
  int64_t next = 0;
  std::vector<SlotBuffer*> free, retired;
  std::vector<CUevent> events;  // recorded, waited for and done: to record again
  // the most blocks of threads a launch of each kernel has (as many as are resident at once on the device):
  // the dense, rows and strided kernels' own launches, and a tensor's in a batch
  unsigned cap[4] = {1024, 1024, 1024, 1024};
};
constexpr u64 kFlags = 1 << 20;

struct Cuda {
  std::string source, nvrtc_path;
  void* nvrtc = nullptr;  // opened by set_cuda
  bool loaded = false;
  std::string why;
  Driver cu;
  Nvrtc rtc;
  std::unordered_map<int, DeviceState> devices;
  unsigned char* flags = nullptr;  // host memory the device writes a flag into: one byte a pending comparison
  volatile u32* any = nullptr;
};
extern Cuda& cuda;

std::string cu_error(CUresult r);

// Whether c is a device's primary context (torch's).
bool is_primary(CUcontext c);

// On device: torch's current device, and for the driver calls made here its primary context current on this thread.
// A thread that has run no CUDA work yet (autograd's device thread, at a backward pass's first saved tensor) has
// no context current: torch's guard sees device 0 there and sets nothing, and the driver would refuse the call.
// A context of the program's own that was current (not a primary one: PyCUDA's, say, on any device) is current
// again after, once torch's guard has given the device back.
struct CurrentContext {  // made before the guard and given back after it
  CUcontext saved = nullptr;
  CurrentContext() {
    if (!cuda.cu.ctxGetCurrent || cuda.cu.ctxGetCurrent(&saved)) saved = nullptr;
  }
  ~CurrentContext() {
    if (saved && !is_primary(saved)) cuda.cu.ctxSetCurrent(saved);
  }
};

struct OnDevice {
  CurrentContext before;
  c10::DeviceGuard guard;
  explicit OnDevice(const c10::Device& device) : guard(device) {
    auto it = cuda.devices.find(device.index());
    if (it == cuda.devices.end() || !it->second.context) return;
    CUcontext now = nullptr;
    if (cuda.cu.ctxGetCurrent(&now) == 0 && now == it->second.context) return;
    cuda.cu.ctxSetCurrent(it->second.context);
  }
  OnDevice(const OnDevice&) = delete;
  OnDevice& operator=(const OnDevice&) = delete;
};

// This device's kernels, compiled and loaded on first use; nullptr (and why) where they cannot be.
DeviceState* cuda_device(const at::Device& device);

struct DeviceFingerprint {
  std::shared_ptr<SlotBuffer> buffer;  // keeps the slot's buffer from being used again
  int64_t slot = -1;
  u64* address() const { return reinterpret_cast<u64*>(buffer->address) + 2 * slot; }
};

// A fresh slot (two zeroed words) on s's device.
void slot_on(DeviceState& s, const at::Device& device, DeviceFingerprint& out);

CUstream current_stream(const at::Device& device);

// Retired buffers zeroed and free again: called once every stream that used them was waited for.
void recycle(std::vector<SlotBuffer*>& buffers);
// Every device's retired buffers, taken from their lists (to recycle once what used them has run).
std::vector<SlotBuffer*> take_retired();
// Every device's retired buffers, recycled now.
void recycle();

}  // namespace torchgen_patch_saved
