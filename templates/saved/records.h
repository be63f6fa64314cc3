// What the saved-tensor check keeps of a saved tensor (a Packed: its Record), of a device comparison until
// its backward pass ends (Pending, Landing), and of one check (Hooks); the Python types' objects and the
// program's frames (records.cpp).

#pragma once

#include <Python.h>

#include "launch.h"
#include "torch_python.h"

#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/function.h>

#include <deque>
#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

namespace torchgen_patch_saved __attribute__((visibility("hidden"))) {

// ---- what the check keeps of a saved tensor ------------------------------------------------------------

enum Skip : int {
  kNotSkipped = 0,
  kSparse,    // layout, its own text (Python)
  kNested,
  kMeta,
  kUnreadable,
  kGraph,     // saved while a CUDA graph was captured
  kFreedNow,  // readable when saved, not now
  kLaunch,    // the fingerprint kernel did not launch at use
  kInBackward,  // saved while a backward pass ran that keeps no graph (a checkpoint's recomputation)
  kReasons
};

struct Facts {  // what a finding needs of a tensor compared at the end of backward
  std::vector<int64_t> shape;
  at::ScalarType dtype = at::kFloat;
  at::Device device = at::Device(at::kCPU);
  int64_t version = 0, numel = 0, element = 0;
  u64 ptr = 0;
  u64 storage = 0;  // its StorageImpl (what untyped_storage()._cdata gives): the same after a resize
  bool requires_grad = false;
};

struct Packed;
struct Group {  // the CUDA tensors saved while one node was made (one sequence number, one thread)
  std::vector<Packed*> members;
};

struct Record {
  int64_t version = 0;
  int device_type = -1, device_index = -1;  // where the tensor was when saved
  bool leaf = false, output = false, host = true;
  int output_nr = 0;
  int skip = kNotSkipped;
  PyObject* layout_name = nullptr;  // for kSparse: the layout's text
  u64 fp = 0;                       // CPU fingerprint
  DeviceFingerprint device;         // CUDA fingerprint
  u64 ptr = 0;
  bool has_ptr = false;
  int64_t steps = 0;
  PyObject* program = nullptr;  // code objects (strong), with their instruction offsets
  int program_at = -1;
  PyObject* site = nullptr;
  int site_at = -1;
  PyObject* call = nullptr;  // the program's frame outside every module's forward (where it called its model)
  int call_at = -1;
  std::shared_ptr<Group> group;  // CUDA: the tensors saved with this one
  // CUDA: read at use already, in a batch with its group, for this backward pass (task) and node: its entry
  // in the pass's pending comparisons, at index `use_index` under record `use_record`
  bool use_ready = false;
  int use_task = 0;
  const void* use_node = nullptr;
  size_t use_index = 0;
  u64 use_record = 0;
};

struct Packed {
  PyObject_HEAD
  PyObject* ref;       // the tensor unpack returns: the tensor itself, or a detached alias for an output
  PyObject* original;  // a weak reference to an output itself (its grad_fn), else nullptr
  Record* r;
};

struct Pending {  // a device comparison waiting for the end of its backward pass
  u64 record;
  Record saved;        // what a finding needs of the save (its frames hold references), without the tensor
  PyObject* original;  // weak reference to the tensor saved, or nullptr
  decltype(torch::autograd::get_current_node()) node;
  Facts facts;
  bool bn_own;  // batch norm's running statistics, updated by this node itself
  bool used;    // unpacked: a comparison made for a batch and never used by its node is not judged
  u64 order;    // when it was used (a pass's findings are judged in the order its tensors were used)
};

// A backward pass's device comparisons read later (warn mode): events recorded at its end on the streams they
// ran on, read once those have run (at a later backward's end, or when the findings are asked for).
struct Landing {
  std::vector<std::pair<c10::Device, CUevent>> events;
  std::vector<Pending> list;
  std::vector<SlotBuffer*> retired;  // buffers retired before its end: free again once its events have run
  PyObject* late;                    // (the backward call's frame, the optimizer step count) at its end
};

struct Hooks {
  PyObject_HEAD
  PyObject* check;     // the Python Check: its callbacks
  PyObject* fallback;  // the Python implementation, for tensors this one does not read
  PyObject* steps;     // the optimizer step counter (attribute.STEPS)
  PyObject* kind;      // attribute._kind(code) -> 0, 1 or 2
  PyObject* plain;     // tuple of the plain tensor types (Tensor, Parameter, Buffer)
  bool active;
  int64_t checked;
  int64_t unpacked;
  int64_t skipped[kReasons];
  std::unordered_map<int, std::vector<Pending>>* pending;  // graph task -> comparisons
  Streams* streams;                                        // used since the last read
  std::unordered_map<PyObject*, int>* kinds;               // code object (strong) -> kind
  std::unordered_map<const void*, std::vector<u64>>* statistics;  // batch norm node -> its own statistics
  std::deque<Landing>* landing;                                   // passes ended, their comparisons in flight
  u64 next_record;
  std::shared_ptr<Group>* group;  // the group pack adds to while the sequence number and thread stay the same
  u64 group_sequence;
  unsigned long group_thread;
  u64 uses;  // comparisons used so far (their order)
  std::vector<int>* unasked;  // passes whose list was made before their first comparison: their end not asked yet
};
constexpr size_t kGroupMax = 64;  // a group this large takes no more members (a batch reads 16 at a time)
extern int batching;  // 0: one launch a tensor at use as well

extern PyTypeObject PackedType;
extern PyTypeObject HooksType;
extern int quiet;  // > 0: unpack returns the tensor without a check (a lookup of the Python side)
extern PyObject* str_count;

// The innermost frame of the program's own code, the innermost outside torch and this package, and the
// innermost of the program's own code that no module's call runs (attribute.caller()'s three).
void capture(Hooks* h, Record* r);

void packed_dealloc(Packed* p);
Packed* new_packed();
extern PyGetSetDef packed_getset[];

}  // namespace torchgen_patch_saved
