// The device comparisons a backward pass keeps until its end (read there: backward_end.cpp), with what a finding
// needs of each, decided while the node that saved the tensor still holds it.

#include "hooks.h"

#include <torch/csrc/autograd/graph_task.h>

#include <algorithm>
#include <string>
#include <typeinfo>

namespace torchgen_patch_saved __attribute__((visibility("hidden"))) {

static Facts facts_of(const at::Tensor& t) {
  Facts f;
  f.shape = t.sizes().vec();
  f.dtype = t.scalar_type();
  f.device = t.device();
  f.version = (int64_t)t._version();
  f.numel = t.numel();
  f.element = (int64_t)t.element_size();
  f.ptr = t.has_storage() ? (u64)(uintptr_t)t.const_data_ptr() : 0;
  f.storage = t.has_storage() ? (u64)(uintptr_t)t.storage().unsafeGetStorageImpl() : 0;
  f.requires_grad = t.requires_grad();
  return f;
}

// Whether node is a batch norm's (its type's name, looked up once per type).
bool is_batch_norm(const decltype(torch::autograd::get_current_node())& node) {
  static std::unordered_map<const std::type_info*, bool> known;
  if (!node) return false;
  const std::type_info* type = &typeid(*node);
  auto it = known.find(type);
  if (it != known.end()) return it->second;
  bool bn = node->name().find("BatchNorm") != std::string::npos;
  known[type] = bn;
  return bn;
}

// The data pointers of the statistics node updates itself (the Python side decides, once per node and
// backward pass, while the node still holds what it saved).
bool saver_statistics(Hooks* h, const decltype(torch::autograd::get_current_node())& node,
                      std::vector<u64>& out) {
  auto it = h->statistics->find(node.get());
  if (it != h->statistics->end()) {
    out = it->second;
    return true;
  }
  PyObject* n = node_object(node);
  ++quiet;
  PyObject* ptrs = n ? PyObject_CallMethod(h->check, "_saver_statistics", "O", n) : nullptr;
  --quiet;
  Py_XDECREF(n);
  if (!ptrs) return false;
  out.clear();
  for (Py_ssize_t i = 0; i < PyTuple_Size(ptrs); ++i) out.push_back(PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(ptrs, i)));
  Py_DECREF(ptrs);
  (*h->statistics)[node.get()] = out;
  return true;
}


// The comparisons of backward passes begun before task, read now: a pass that raised never reaches its end
// (its callbacks do not run), and one that encloses this one (a reentrant backward) is read early.
static bool flush_earlier(Hooks* h, int task) {
  std::vector<int> earlier;
  for (auto& [other, list] : *h->pending)
    if (other < task) earlier.push_back(other);
  for (int other : earlier) {
    PyObject* res = flush_task(h, other, nullptr);
    if (!res) return false;
    Py_DECREF(res);
  }
  return true;
}

// The list of task's comparisons, made before any of them is launched: the passes begun before it are read first
// (which clears the flag that says some comparison differed, once no list is left: none of task's may be in
// flight then). Its end is asked for once it holds one (ask_end). false: a callback raised.
bool begin_task(Hooks* h, int task) {
  if (h->pending->find(task) != h->pending->end()) return true;
  if (!flush_earlier(h, task)) return false;
  (*h->pending)[task];
  h->unasked->push_back(task);
  return true;
}

// task's comparisons read at its end, asked for once (outside a backward pass, task -1: read now).
bool ask_end(Hooks* h, int task) {
  auto it = std::find(h->unasked->begin(), h->unasked->end(), task);
  if (it == h->unasked->end()) return true;
  h->unasked->erase(it);
  PyObject* ok = PyObject_CallMethod(h->check, "_at_end_of_backward", "i", task);
  if (!ok) return false;
  Py_DECREF(ok);
  return true;
}

// Batch norm's own statistics decided for t's node (saver_statistics keeps them), before anything of t is launched.
bool decide_statistics(Hooks* h, const at::Tensor& t) {
  if (t.dim() != 1) return true;
  auto node = torch::autograd::get_current_node();
  if (!is_batch_norm(node)) return true;
  std::vector<u64> stats;
  return saver_statistics(h, node, stats);
}

// A device comparison in flight: kept (without the tensor) until its backward pass ends.
// used: unpacked now (else read in a batch, judged only once its own unpack marks it used); index: where it went.
// ask: ask for the pass's end now (launch_group asks once it has kept every comparison it launched).
bool defer(Hooks* h, Packed* p, const at::Tensor& t, PyObject* original, u64 record, bool used, size_t* index,
           bool ask) {
  int task = torch::autograd::get_current_graph_task_id();
  auto node = torch::autograd::get_current_node();
  Pending e{record, Record(), nullptr, node, facts_of(t), false, used, used ? h->uses++ : 0};
  if (t.dim() == 1 && is_batch_norm(node)) {  // decided now, while the node still holds what it saved
    std::vector<u64> stats;
    if (!saver_statistics(h, node, stats)) return false;
    e.bn_own = std::find(stats.begin(), stats.end(), e.facts.ptr) != stats.end();
  }
  e.saved = *p->r;  // the save's facts without its tensor (which autograd frees after use)
  Py_XINCREF(e.saved.program);
  Py_XINCREF(e.saved.site);
  Py_XINCREF(e.saved.call);
  Py_XINCREF(e.saved.layout_name);
  e.saved.device = DeviceFingerprint();
  e.saved.group.reset();
  e.original = original ? PyWeakref_NewRef(original, nullptr) : nullptr;
  if (!e.original) PyErr_Clear();
  if (!begin_task(h, task)) return false;
  auto& list = (*h->pending)[task];
  if (index) *index = list.size();
  list.push_back(std::move(e));
  return !ask || ask_end(h, task);
}

}  // namespace torchgen_patch_saved
