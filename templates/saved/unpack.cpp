// The saved-tensor check's unpack hook: the version and the fingerprint compared at use (CPU: at once; CUDA:
// launched to compare on the device, a node's saved tensors in one launch, read at the end of the pass).

#include "hooks.h"

#include <torch/csrc/autograd/graph_task.h>

#include <exception>
#include <memory>
#include <string>
#include <vector>

namespace torchgen_patch_saved __attribute__((visibility("hidden"))) {

// A tensor not judged, counted by reason (a layout's reason is its own text, counted on the Python side).
static void skip(Hooks* h, Record* r, int reason) {
  if (reason == kSparse && r && r->layout_name) {
    PyObject* res = PyObject_CallMethod(h->check, "_skip_layout", "O", r->layout_name);
    if (!res) PyErr_Clear();
    Py_XDECREF(res);
    return;
  }
  h->skipped[reason] += 1;
}

// The Python check told that p's tensor changed between its save and now (obj: p; original: the tensor saved, or
// nullptr where it is gone). false: the check raised.
static bool report_changed(Hooks* h, PyObject* obj, Packed* p, PyObject* original) {
  PyObject* node = node_object(torch::autograd::get_current_node());
  PyObject* res = PyObject_CallMethod(h->check, "_changed", "OOOO", obj, p->ref, original ? original : Py_None, node);
  Py_XDECREF(node);
  if (!res) return false;
  Py_DECREF(res);
  return true;
}

// At use, a CUDA tensor whose layout the kernels do not read (it changed since it was saved, else the save
// would have gone to the Python path): its fingerprint at save read back now (a wait, on this rare path),
// compared with the Python path's reading of it.
static PyObject* compare_now(Hooks* h, PyObject* obj, Packed* p, const at::Tensor& t, PyObject* original) {
  OnDevice guard(t.device());
  cuda.cu.streamSynchronize(current_stream(t.device()));
  u64 saved = 0;
  CUresult rc = cuda.cu.memcpyDtoH(&saved, (u64)(uintptr_t)p->r->device.address(), sizeof saved);
  if (rc) return PyErr_Format(PyExc_RuntimeError, "cannot read a fingerprint: %s", cu_error(rc).c_str());
  PyObject* same = PyObject_CallMethod(h->check, "_same_bits", "OK", p->ref, (unsigned long long)saved);
  if (!same) return nullptr;
  int kept = PyObject_IsTrue(same);
  Py_DECREF(same);
  if (!kept && !report_changed(h, obj, p, original)) return nullptr;
  return Py_NewRef(p->ref);
}

// r, read at use in a batch with its group for this backward pass and node: its comparison (kept then) used now.
static bool used_from_batch(Hooks* h, Record* r) {
  if (!r->use_ready) return false;
  r->use_ready = false;
  const int task = torch::autograd::get_current_graph_task_id();
  if (r->use_task != task || r->use_node != torch::autograd::get_current_node().get()) return false;
  auto it = h->pending->find(task);
  if (it == h->pending->end() || r->use_index >= it->second.size() || it->second[r->use_index].record != r->use_record)
    return false;  // its pass's comparisons were read already
  it->second[r->use_index].used = true;
  it->second[r->use_index].order = h->uses++;
  return true;
}

// The readings of one launch_group: a batch filled a tensor at a time, launched when full and at the end;
// `launched`: the readings of the batches that launched, in order.
struct BatchReader {
  struct Read {
    Packed* p;
    u64 record;
  };
  Hooks* h;
  DeviceState& s;
  const at::Device device;
  CUstream stream;
  std::vector<Read> reads, launched;
  std::vector<DeviceFingerprint> slots;  // the batch's slots, kept until it is launched
  Batch b;

  void send() {
    if (!b.n) return;
    if (launch_batch(s, device, stream, b, h->streams).empty())
      launched.insert(launched.end(), reads.begin(), reads.end());
    reads.clear();
    slots.clear();
    b.n = 0;
  }

  // m's tensor mt into the batch (sent once full): an empty string, or why it was not read.
  std::string add(Packed* m, const at::Tensor& mt) {
    DeviceFingerprint f;
    const u64 record = h->next_record;
    std::string not_read = item_of(mt, s, f, m->r->device.address(), record, b.item[b.n], true);
    if (!not_read.empty()) return not_read;
    ++h->next_record;
    ++b.n;
    reads.push_back({m, record});
    slots.push_back(std::move(f));
    if (b.n == kBatch) send();
    return not_read;
  }
};

// The other tensors of p's group (members) into reader: those this node has not read in this pass yet that are
// unchanged, on reader's device and readable.
static void add_members(BatchReader& reader, Packed* p, const std::vector<PyObject*>& members, int task,
                        const void* node) {
  for (PyObject* o : members) {
    Packed* m = (Packed*)o;
    Record* mr = m->r;
    if (m == p || mr->skip || mr->host || (mr->use_ready && mr->use_task == task && mr->use_node == node))
      continue;
    const at::Tensor& mt = tensor_of(m->ref);
    if ((int64_t)mt._version() != mr->version || mt.device() != reader.device ||
        (int)mt.device().type() != mr->device_type || (int)mt.device().index() != mr->device_index || !readable(mt))
      continue;  // changed, moved (its own unpack says so) or freed: not read here
    reader.add(m, mt);
  }
}

// Every comparison launched kept, so that the flag it may leave is read and cleared with its pass's: p's as used
// now (original: its tensor saved), each other's marked for its own unpack to use. false: a callback raised.
static bool keep_launched(Hooks* h, Packed* p, PyObject* original, const std::vector<BatchReader::Read>& launched,
                          int task, const void* node) {
  for (const BatchReader::Read& read : launched) {
    Packed* m = read.p;
    const at::Tensor& mt = tensor_of(m->ref);
    PyObject* mo = m == p ? original : m->original ? PyWeakref_GetObject(m->original) : m->ref;
    if (mo == Py_None) mo = nullptr;
    size_t index = 0;
    if (!defer(h, m, mt, mo, read.record, m == p, &index, false)) return false;
    if (m == p) continue;
    Record* mr = m->r;
    mr->use_ready = true;
    mr->use_task = task;
    mr->use_node = node;
    mr->use_index = index;
    mr->use_record = read.record;
  }
  return true;
}

// At use, p's tensor t read in one launch with the other tensors of its group that this node has not read in this
// pass yet (autograd unpacks a node's saved tensors one after another before it computes anything): each
// comparison kept, p's as used, the others' to be used by their own unpack (a comparison never used is never
// judged). why: empty, or why p's tensor was not read (nothing kept for it). false: a callback raised.
static bool launch_group(Hooks* h, Packed* p, const at::Tensor& t, PyObject* original, DeviceState& s,
                         std::string& why) {
  const at::Device device = t.device();
  OnDevice guard(device);
  CUstream stream = current_stream(device);
  if (capturing(stream)) return (why = kCaptured), true;
  const auto node = torch::autograd::get_current_node();
  const int task = torch::autograd::get_current_graph_task_id();
  if (!begin_task(h, task)) return false;
  if (is_batch_norm(node)) {  // decided before anything is launched: what follows the launches cannot fail
    std::vector<u64> stats;
    if (!saver_statistics(h, node, stats)) return false;
  }
  std::vector<PyObject*> members;  // held while callbacks run
  for (Packed* m : p->r->group->members) members.push_back(Py_NewRef((PyObject*)m));
  std::unique_ptr<std::vector<PyObject*>, void (*)(std::vector<PyObject*>*)> hold(
      &members, [](std::vector<PyObject*>* v) { for (PyObject* o : *v) Py_DECREF(o); });
  BatchReader reader{h, s, device, stream};
  std::exception_ptr thrown;  // (no device memory for a new buffer of slots, say) after some were launched
  try {
    why = reader.add(p, t);
    if (!why.empty()) return true;
    add_members(reader, p, members, task, node.get());
    reader.send();
  } catch (...) {
    thrown = std::current_exception();
  }
  if (reader.launched.empty() || reader.launched.front().p != p) why = "the fingerprint kernel did not launch";
  if (!keep_launched(h, p, original, reader.launched, task, node.get())) return false;
  if (!ask_end(h, task)) return false;
  if (thrown) std::rethrow_exception(thrown);
  return true;
}

// At use, a tensor saved on the host, or one on another device now: compared at once (a layout the native code
// does not read now: by the Python path).
static PyObject* compare_on_host(Hooks* h, PyObject* obj, Packed* p, const at::Tensor& t, PyObject* original,
                                 bool moved) {
  Record now_r;
  bool differs = moved;  // on another device now: other storage, whatever its bits
  if (!moved && !fingerprint_into(t, &now_r, h, nullptr, 0, nullptr)) {
    PyObject* same = PyObject_CallMethod(h->check, "_same_bits", "OK", p->ref, (unsigned long long)p->r->fp);
    if (!same) return nullptr;  // a layout the native code does not read (now): the Python one compares
    differs = PyObject_IsTrue(same) == 0;
    Py_DECREF(same);
  } else if (!moved) {
    differs = now_r.fp != p->r->fp;
  }
  if (differs && !report_changed(h, obj, p, original)) return nullptr;
  return Py_NewRef(p->ref);
}

// At use, a tensor saved on its CUDA device and there now: its comparison launched on the device (with its group's,
// in one launch) and kept until its backward pass ends; where none can be launched, not judged, or (a layout
// the kernels do not read now) compared at once.
static PyObject* compare_on_device(Hooks* h, PyObject* obj, Packed* p, const at::Tensor& t, PyObject* original) {
  Record* r = p->r;
  if (used_from_batch(h, r)) return Py_NewRef(p->ref);
  DeviceState* s = cuda_device(t.device());  // the device's kernels: loaded when this tensor was saved
  std::string why = s ? "" : "no kernel";
  if (s && batching && r->group && r->group->members.size() > 1 && torch::autograd::get_current_node()) {
    if (!launch_group(h, p, t, original, *s, why)) return nullptr;
    if (why.empty()) return Py_NewRef(p->ref);
  }
  u64 record = h->next_record++;
  Record now_r;
  if (s && why.empty()) {
    {
      OnDevice on(t.device());
      if (capturing(current_stream(t.device()))) why = kCaptured;  // nothing kept, no pass's end asked for
    }
    if (why.empty() && (!begin_task(h, torch::autograd::get_current_graph_task_id()) || !decide_statistics(h, t)))
      return nullptr;
    if (why.empty()) why = launch(t, *s, now_r.device, r->device.address(), record, h->streams);
  }
  if (why == kLayoutChanged) return compare_now(h, obj, p, t, original);
  if (!why.empty()) {  // a graph being captured now, or a launch that failed: not judged
    h->checked -= 1;
    skip(h, r, why == kCaptured ? kGraph : kLaunch);
    return Py_NewRef(p->ref);
  }
  if (!defer(h, p, t, original, record)) return nullptr;
  return Py_NewRef(p->ref);
}

PyObject* hooks_unpack(Hooks* h, PyObject* obj) {
  if (Py_TYPE(obj) != &PackedType) return call_fallback(h, "unpack", obj);
  Packed* p = (Packed*)obj;
  if (quiet || !h->active) return Py_NewRef(p->ref);
  try {
    Record* r = p->r;
    h->unpacked += 1;
    const at::Tensor& t = tensor_of(p->ref);
    PyObject* original = p->original ? PyWeakref_GetObject(p->original) : p->ref;  // borrowed; None when dead
    if (original == Py_None) original = nullptr;
    int64_t now = (int64_t)t._version();
    if (now != r->version) {
      PyObject* res = PyObject_CallMethod(h->check, "_moved", "OOLO", obj, p->ref, (long long)now,
                                          original ? original : Py_None);
      Py_XDECREF(res);
      return nullptr;  // _moved raised autograd's own error
    }
    if (r->skip) {
      skip(h, r, r->skip);
      return Py_NewRef(p->ref);
    }
    if (!readable(t)) {
      skip(h, r, kFreedNow);
      return Py_NewRef(p->ref);
    }
    h->checked += 1;
    bool moved = (int)t.device().type() != r->device_type || (int)t.device().index() != r->device_index;
    if (r->host || moved) return compare_on_host(h, obj, p, t, original, moved);
    return compare_on_device(h, obj, p, t, original);
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
}

}  // namespace torchgen_patch_saved
