// The saved-tensor check's pack hook: what it keeps of a tensor autograd saves.

#include "hooks.h"

#include <ATen/SequenceNumber.h>
#include <torch/csrc/autograd/graph_task.h>

#include <exception>
#include <memory>

namespace torchgen_patch_saved __attribute__((visibility("hidden"))) {

static bool plain(Hooks* h, PyObject* obj) {
  PyTypeObject* type = Py_TYPE(obj);
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(h->plain); ++i)
    if ((PyObject*)type == PyTuple_GET_ITEM(h->plain, i)) return true;
  return false;
}

// What kind of reading t gets: 0 here (CPU), 1 the device kernel, 2 the Python implementation; or a Skip.
int reading(const at::Tensor& t, Record* r) {
  if (t.layout() != at::kStrided) return -kSparse;
  if (t.is_nested()) return -kNested;
  if (t.is_meta()) return -kMeta;
  if (!t.has_storage()) return 2;
  if (t.is_cpu()) return 0;
  if (t.is_cuda()) return 1;
  return 2;
}

// The fingerprint of t into r (host value or device slot); false: left to the Python implementation.
bool fingerprint_into(const at::Tensor& t, Record* r, Hooks* h, const u64* expect, u64 record, bool* changed) {
  if (!t.numel()) {
    r->host = true;
    r->fp = 0;
    return true;
  }
  if (!readable(t)) {
    r->skip = kUnreadable;
    return true;
  }
  const unsigned char* base = static_cast<const unsigned char*>(t.const_data_ptr());
  if (t.is_cpu()) {
    r->host = true;
    if (dense(t)) {
      r->fp = fingerprint_block(base, t.numel() * t.element_size());
    } else {
      Layout l;
      if (!collapse(t, l)) return false;
      r->fp = fingerprint_strided(base, l, t.numel());
    }
    return true;
  }
  DeviceState* s = cuda_device(t.device());
  if (!s) return false;
  r->host = false;
  std::string why = launch(t, *s, r->device, expect, record, h->streams);
  if (why.empty()) return true;
  if (why == kCaptured) {
    r->skip = kGraph;
    return true;
  }
  return false;
}

// p (a CUDA tensor's save) into the group of the node being made: the saves made while autograd's sequence number
// (a node's, taken when it is made) and the thread stay the same.
static void join_group(Hooks* h, Packed* p) {
  const u64 sequence = at::sequence_number::peek();
  const unsigned long thread = PyThread_get_thread_ident();
  std::shared_ptr<Group>& g = *h->group;
  if (!g || h->group_sequence != sequence || h->group_thread != thread || g->members.size() >= kGroupMax) {
    g = std::make_shared<Group>();
    h->group_sequence = sequence;
    h->group_thread = thread;
  }
  g->members.push_back(p);
  p->r->group = g;
}

PyObject* call_fallback(Hooks* h, const char* method, PyObject* arg) {
  return PyObject_CallMethod(h->fallback, method, "O", arg);
}

// Whether a tensor is saved while a backward pass runs on this thread that keeps no graph (no retain_graph, no
// create_graph): a reentrant checkpoint's recomputation, whose saves the pass uses and frees before it returns.
static bool saved_in_backward() {
  return torch::autograd::get_current_graph_task_id() != -1 && !torch::autograd::get_current_graph_task_keep_graph();
}

PyObject* hooks_pack(Hooks* h, PyObject* obj) {
  if (!h->active) return call_fallback(h, "passed", obj);
  if (!is_tensor(obj) || !plain(h, obj)) return call_fallback(h, "pack", obj);
  try {
    const at::Tensor& t = tensor_of(obj);
    int how = reading(t, nullptr);
    if (how == 2) return call_fallback(h, "pack", obj);
    Packed* p = new_packed();
    if (!p) return nullptr;
    PyObject* owned = (PyObject*)p;  // released if what follows throws
    std::unique_ptr<PyObject, void (*)(PyObject*)> guard(owned, [](PyObject* o) { Py_DECREF(o); });
    Record* r = p->r;
    r->version = (int64_t)t._version();
    r->device_type = (int)t.device().type();
    r->device_index = (int)t.device().index();
    r->leaf = t.is_leaf();
    if (!r->leaf) {
      const auto& gf = t.grad_fn();
      r->output = !gf || gf->sequence_nr() + 1 == at::sequence_number::peek();
      r->output_nr = (int)t.output_nr();
    }
    if (r->output) {
      p->ref = tensor_object(t.tensor_data());
      p->original = PyWeakref_NewRef(obj, nullptr);
      if (!p->original) PyErr_Clear();
    } else {
      p->ref = Py_NewRef(obj);
    }
    if (how >= 0 && saved_in_backward()) {
      r->skip = kInBackward;  // used by the pass that saves it: no write of the program's comes between
      return guard.release();
    } else if (how < 0) {
      r->skip = -how;
      if (r->skip == kSparse) {
        PyObject* layout = PyObject_GetAttrString(obj, "layout");
        r->layout_name = layout ? PyObject_Str(layout) : nullptr;
        Py_XDECREF(layout);
        if (!r->layout_name) PyErr_Clear();
      }
    } else if (!fingerprint_into(t, r, h, nullptr, 0, nullptr)) {
      return call_fallback(h, "pack", obj);  // (p released by the guard)
    }
    if (t.has_storage() && how >= 0) {
      r->ptr = (u64)(uintptr_t)t.const_data_ptr();
      r->has_ptr = true;
    }
    if (!r->host && !r->skip) join_group(h, p);
    PyObject* count = PyObject_GetAttr(h->steps, str_count);
    r->steps = count ? PyLong_AsLongLong(count) : 0;
    Py_XDECREF(count);
    capture(h, r);
    if (PyErr_Occurred()) PyErr_Clear();
    return guard.release();
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
}

}  // namespace torchgen_patch_saved
