// The saved-tensor check's CUDA driver and NVRTC, looked up at run time: each device's kernels compiled
// (fingerprint.cu) and loaded on first use, and the buffers of slots their launches write into.

#include "cuda.h"
#include "fingerprint.h"

#include <ATen/ops/empty.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <dlfcn.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>

namespace torchgen_patch_saved __attribute__((visibility("hidden"))) {

Cuda& cuda = *new Cuda();  // never destroyed: slot buffers released at exit still find their device's lists

std::string cu_error(CUresult r) {
  const char* s = nullptr;
  if (cuda.cu.getErrorString) cuda.cu.getErrorString(r, &s);
  return std::string("CUDA error ") + std::to_string(r) + (s ? std::string(" (") + s + ")" : "");
}

bool is_primary(CUcontext c) {
  for (auto& [index, s] : cuda.devices)
    if (s.context == c) return true;
  return false;
}

template <typename F>
bool sym(void* lib, const char* name, F& out) {
  out = reinterpret_cast<F>(dlsym(lib, name));
  return out != nullptr;
}

// The driver (already loaded by torch) and NVRTC (at the path the Python side chose); the reason if not.
static bool load_cuda() {
  if (cuda.loaded || !cuda.why.empty()) return cuda.loaded;
  void* cu = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (!cu) cu = dlopen("libcuda.so.1", RTLD_NOW);
  if (!cu) return (cuda.why = "the CUDA driver library (libcuda.so.1) is not loaded"), false;
  Driver& d = cuda.cu;
  bool ok = sym(cu, "cuModuleLoadData", d.moduleLoadData) && sym(cu, "cuModuleGetFunction", d.moduleGetFunction) &&
            sym(cu, "cuLaunchKernel", d.launchKernel) && sym(cu, "cuStreamSynchronize", d.streamSynchronize) &&
            sym(cu, "cuStreamIsCapturing", d.streamIsCapturing) && sym(cu, "cuMemHostAlloc", d.memHostAlloc) &&
            sym(cu, "cuDeviceGetAttribute", d.deviceGetAttribute) &&
            sym(cu, "cuGetErrorString", d.getErrorString) && sym(cu, "cuMemAlloc_v2", d.memAlloc) &&
            sym(cu, "cuMemsetD32Async", d.memsetD32Async) && sym(cu, "cuMemcpyDtoH_v2", d.memcpyDtoH) &&
            sym(cu, "cuEventCreate", d.eventCreate) && sym(cu, "cuEventRecord", d.eventRecord) &&
            sym(cu, "cuEventQuery", d.eventQuery) && sym(cu, "cuEventSynchronize", d.eventSynchronize) &&
            sym(cu, "cuDeviceGet", d.deviceGet) && sym(cu, "cuDevicePrimaryCtxRetain", d.primaryCtxRetain) &&
            sym(cu, "cuCtxGetCurrent", d.ctxGetCurrent) && sym(cu, "cuCtxSetCurrent", d.ctxSetCurrent);
  sym(cu, "cuOccupancyMaxActiveBlocksPerMultiprocessor", d.occupancy);  // optional: else two blocks resident
  if (!ok) return (cuda.why = "the CUDA driver lacks a function the check launches with"), false;
  if (!cuda.nvrtc) return (cuda.why = "no NVRTC library was found beside torch or CUDA"), false;
  void* rt = cuda.nvrtc;
  Nvrtc& n = cuda.rtc;
  ok = sym(rt, "nvrtcCreateProgram", n.create) && sym(rt, "nvrtcCompileProgram", n.compile) &&
       sym(rt, "nvrtcGetPTXSize", n.ptxSize) && sym(rt, "nvrtcGetPTX", n.ptx) &&
       sym(rt, "nvrtcGetProgramLogSize", n.logSize) && sym(rt, "nvrtcGetProgramLog", n.log) &&
       sym(rt, "nvrtcDestroyProgram", n.destroy);
  sym(rt, "nvrtcGetCUBINSize", n.cubinSize);
  sym(rt, "nvrtcGetCUBIN", n.cubin);
  sym(rt, "nvrtcGetNumSupportedArchs", n.numArchs);
  sym(rt, "nvrtcGetSupportedArchs", n.archs);
  if (!ok) return (cuda.why = "the NVRTC library lacks a function the check compiles with"), false;
  void* flags = nullptr;
  CUresult r = d.memHostAlloc(&flags, kFlags + 64, 0);
  if (r) return (cuda.why = "no host memory for the check's flags: " + cu_error(r)), false;
  std::memset(flags, 0, kFlags + 64);
  cuda.flags = static_cast<unsigned char*>(flags);
  cuda.any = reinterpret_cast<volatile u32*>(cuda.flags + kFlags);
  return cuda.loaded = true;
}

// The kernels' image for compute capability cc: machine code where NVRTC knows the architecture, else PTX
// for the newest virtual architecture it knows below it (the driver compiles that).
static std::string compile(int cc, std::string& image) {
  Nvrtc& n = cuda.rtc;
  int best = cc;
  bool real = n.cubin && n.cubinSize;
  if (n.numArchs && n.archs) {
    int count = 0;
    n.numArchs(&count);
    std::vector<int> archs((size_t)std::max(count, 0));
    if (count) n.archs(archs.data());
    best = 0;
    for (int a : archs)
      if (a <= cc && a > best) best = a;
    if (!best) return "NVRTC knows no architecture up to compute capability " + std::to_string(cc);
    real = real && best == cc;
  }
  nvrtcProgram prog = nullptr;
  if (n.create(&prog, cuda.source.c_str(), "saved_fingerprint.cu", 0, nullptr, nullptr))
    return "NVRTC could not create the program";
  std::string arch = (real ? "--gpu-architecture=sm_" : "--gpu-architecture=compute_") + std::to_string(best);
  const char* opts[] = {arch.c_str(), "--std=c++14"};
  int rc = n.compile(prog, 2, opts);
  std::string error;
  if (rc) {
    size_t size = 0;
    n.logSize(prog, &size);
    std::string text(size, '\0');
    if (size) n.log(prog, &text[0]);
    error = "NVRTC could not compile the fingerprint kernel (" + arch + "): " + text;
  } else {
    size_t size = 0;
    (real ? n.cubinSize : n.ptxSize)(prog, &size);
    image.assign(size, '\0');
    (real ? n.cubin : n.ptx)(prog, &image[0]);
  }
  n.destroy(&prog);
  return error;
}

// This device's kernels, compiled and loaded on first use; nullptr (and why) where they cannot be.
DeviceState* cuda_device(const at::Device& device) {
  DeviceState& s = cuda.devices[device.index()];
  if (s.tried) return s.why.empty() ? &s : nullptr;
  s.tried = true;
  if (!load_cuda()) return (s.why = cuda.why), nullptr;
  c10::DeviceGuard guard(device);
  CUdevice dev = 0;
  CUresult r = cuda.cu.deviceGet(&dev, device.index());
  if (!r) r = cuda.cu.primaryCtxRetain(&s.context, dev);
  if (r) return (s.why = "no CUDA context: " + cu_error(r)), nullptr;
  OnDevice current(device);  // the module is loaded into the current context: the primary one
  int major = 0, minor = 0, sms = 0;
  cuda.cu.deviceGetAttribute(&major, 75, dev);  // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
  cuda.cu.deviceGetAttribute(&minor, 76, dev);  // ..._MINOR
  cuda.cu.deviceGetAttribute(&sms, 16, dev);    // CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
  std::string image;
  std::string error = compile(major * 10 + minor, image);
  if (!error.empty()) return (s.why = error), nullptr;
  CUmodule module = nullptr;
  if ((r = cuda.cu.moduleLoadData(&module, image.data())))
    return (s.why = "the fingerprint kernel does not load: " + cu_error(r)), nullptr;
  if ((r = cuda.cu.moduleGetFunction(&s.dense, module, "fingerprint_dense")) ||
      (r = cuda.cu.moduleGetFunction(&s.strided, module, "fingerprint_strided")) ||
      (r = cuda.cu.moduleGetFunction(&s.rows, module, "fingerprint_rows")) ||
      (r = cuda.cu.moduleGetFunction(&s.batch, module, "fingerprint_batch")))
    return (s.why = "the fingerprint kernel has no entry point: " + cu_error(r)), nullptr;
  const CUfunction kernels[4] = {s.dense, s.rows, s.strided, s.batch};
  for (int i = 0; i < 4; ++i) {  // blocks of 256 threads resident a multiprocessor (by each kernel's registers)
    int resident = 0;
    if (!cuda.cu.occupancy || cuda.cu.occupancy(&resident, kernels[i], 256, 0) || resident < 1) resident = 2;
    s.cap[i] = (unsigned)std::max(1, sms) * (unsigned)resident;
  }
  at::Tensor k = at::empty({kWords}, at::TensorOptions().dtype(at::kInt));
  std::memcpy(k.data_ptr(), key.nh, sizeof key.nh);
  s.key = k.to(device);
  return &s;
}

constexpr size_t kSlotWords32 = (size_t)kSlots * 4;  // two 64-bit words a slot, as 32-bit words

// A zeroed buffer of slots on s's device (the current device): a recycled one, or new memory zeroed before
// any stream can use it (the legacy default stream waited for; once, until buffers come back).
static std::shared_ptr<SlotBuffer> buffer_on(DeviceState& s, int device) {
  SlotBuffer* b = nullptr;
  if (!s.free.empty()) {
    b = s.free.back();
    s.free.pop_back();
  } else {
    b = new SlotBuffer();
    b->device = device;
    CUresult r = cuda.cu.memAlloc(&b->address, kSlotWords32 * 4);
    if (r) {
      delete b;
      throw std::runtime_error("no device memory for the check's slots: " + cu_error(r));
    }
    cuda.cu.memsetD32Async(b->address, 0, kSlotWords32, nullptr);
    cuda.cu.streamSynchronize(nullptr);
  }
  return std::shared_ptr<SlotBuffer>(b, [](SlotBuffer* done) { cuda.devices[done->device].retired.push_back(done); });
}

// Retired buffers zeroed and free again (the legacy default stream waited for): called once every stream
// that used them was waited for.
void recycle(std::vector<SlotBuffer*>& buffers) {
  std::vector<int> devices;
  for (SlotBuffer* b : buffers) {
    OnDevice guard(c10::Device(c10::DeviceType::CUDA, (c10::DeviceIndex)b->device));
    cuda.cu.memsetD32Async(b->address, 0, kSlotWords32, nullptr);
    if (std::find(devices.begin(), devices.end(), b->device) == devices.end()) devices.push_back(b->device);
  }
  for (int d : devices) {
    OnDevice guard(c10::Device(c10::DeviceType::CUDA, (c10::DeviceIndex)d));
    cuda.cu.streamSynchronize(nullptr);
  }
  for (SlotBuffer* b : buffers) cuda.devices[b->device].free.push_back(b);
  buffers.clear();
}

// Every device's retired buffers, taken from their lists (to recycle once what used them has run).
std::vector<SlotBuffer*> take_retired() {
  std::vector<SlotBuffer*> out;
  for (auto& [index, s] : cuda.devices) {
    out.insert(out.end(), s.retired.begin(), s.retired.end());
    s.retired.clear();
  }
  return out;
}

void recycle() {
  std::vector<SlotBuffer*> all = take_retired();
  recycle(all);
}

// A fresh slot (two zeroed words) on s's device.
void slot_on(DeviceState& s, const at::Device& device, DeviceFingerprint& out) {
  if (!s.current || s.next == kSlots) {
    s.current = buffer_on(s, device.index());
    s.next = 0;
  }
  out.buffer = s.current;
  out.slot = s.next++;
}

CUstream current_stream(const at::Device& device) {
  const auto* impl = c10::impl::getDeviceGuardImpl(device.type());
  return static_cast<CUstream>(impl->getStream(device).native_handle());
}

}  // namespace torchgen_patch_saved
