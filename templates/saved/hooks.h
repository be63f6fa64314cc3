// What the parts of the saved-tensor check's hooks call of one another: the pack hook (pack.cpp), the
// comparisons a backward pass keeps (pending.cpp), the unpack hook (unpack.cpp) and the end of a backward
// pass (backward_end.cpp). module.cpp makes the Python type of them.

#pragma once

#include "records.h"

#include <string>
#include <vector>

namespace torchgen_patch_saved __attribute__((visibility("hidden"))) {

// ---- pack.cpp

// autograd's pack hook: a Packed for a plain tensor the native code reads, else the Python implementation's.
PyObject* hooks_pack(Hooks* h, PyObject* obj);

// The Python implementation's method (pack, unpack, passed) called with arg.
PyObject* call_fallback(Hooks* h, const char* method, PyObject* arg);

// What kind of reading t gets: 0 here (CPU), 1 the device kernel, 2 the Python implementation; or a Skip.
int reading(const at::Tensor& t, Record* r);

// The fingerprint of t into r (host value or device slot); false: left to the Python implementation.
bool fingerprint_into(const at::Tensor& t, Record* r, Hooks* h, const u64* expect, u64 record, bool* changed);

// ---- pending.cpp

// Whether node is a batch norm's (its type's name, looked up once per type).
bool is_batch_norm(const decltype(torch::autograd::get_current_node())& node);

// The data pointers of the statistics node updates itself (the Python side decides, once per node and
// backward pass, while the node still holds what it saved).
bool saver_statistics(Hooks* h, const decltype(torch::autograd::get_current_node())& node,
                      std::vector<u64>& out);

// The list of task's comparisons, made before any of them is launched (the passes begun before it read
// first). false: a callback raised.
bool begin_task(Hooks* h, int task);

// task's comparisons read at its end, asked for once (outside a backward pass, task -1: read now).
bool ask_end(Hooks* h, int task);

// Batch norm's own statistics decided for t's node, before anything of t is launched.
bool decide_statistics(Hooks* h, const at::Tensor& t);

// A device comparison in flight: kept (without the tensor) until its backward pass ends.
// used: unpacked now (else read in a batch, judged only once its own unpack marks it used); index: where it went.
// ask: ask for the pass's end now (launch_group asks once it has kept every comparison it launched).
bool defer(Hooks* h, Packed* p, const at::Tensor& t, PyObject* original, u64 record, bool used = true,
           size_t* index = nullptr, bool ask = true);

// ---- unpack.cpp

// autograd's unpack hook: the tensor, once its version and fingerprint are compared (or their comparison
// launched); the Python implementation's for what it packed.
PyObject* hooks_unpack(Hooks* h, PyObject* obj);

// ---- backward_end.cpp

// The references the entries of list hold, released.
void release(std::vector<Pending>& list);

// The passes ended whose comparisons have all run (wait: every one, waited for), judged in the order they
// ended; false: a callback raised.
bool settle(Hooks* h, bool wait);

// Read task's device comparisons: now (late nullptr), or, with late (warn mode), once they have run.
PyObject* flush_task(Hooks* h, int task, PyObject* late);

}  // namespace torchgen_patch_saved
