// The end of a backward pass: one read of its device comparisons, now or (warn mode) once they have run,
// and the findings of those that differ handed to the Python check.

#include "hooks.h"

#include <algorithm>

namespace torchgen_patch_saved __attribute__((visibility("hidden"))) {

static PyObject* facts_object(Hooks* h, const Facts& f) {
  PyObject* shape = PyTuple_New((Py_ssize_t)f.shape.size());
  for (size_t i = 0; i < f.shape.size(); ++i) PyTuple_SET_ITEM(shape, (Py_ssize_t)i, PyLong_FromLongLong(f.shape[i]));
  PyObject* device = device_object(f.device);
  PyObject* res = PyObject_CallMethod(h->check, "_facts", "NONLKLLOK", shape, dtype_object(f.dtype),
                                      device, (long long)f.version, (unsigned long long)f.ptr, (long long)f.numel,
                                      (long long)f.element, f.requires_grad ? Py_True : Py_False,
                                      (unsigned long long)f.storage);
  return res;
}

void release(std::vector<Pending>& list) {
  for (auto& e : list) {
    Py_XDECREF(e.saved.program);
    Py_XDECREF(e.saved.site);
    Py_XDECREF(e.saved.call);
    Py_XDECREF(e.saved.layout_name);
    Py_XDECREF(e.original);
    e.saved.program = e.saved.site = e.saved.call = e.saved.layout_name = e.original = nullptr;
  }
}

// The save of e as a Packed (its tensor gone), for the finding: the Record's references move into it.
static PyObject* packed_of(Pending& e) {
  Packed* p = new_packed();
  if (!p) return nullptr;
  *p->r = e.saved;
  e.saved.program = e.saved.site = e.saved.call = e.saved.layout_name = nullptr;
  return (PyObject*)p;
}

// The flags the comparisons of list left (they have all run).
static std::vector<bool> flags_of(Hooks* h, const std::vector<Pending>& list) {
  std::vector<bool> changed(list.size(), false);
  if (cuda.any && *cuda.any) {
    for (size_t i = 0; i < list.size(); ++i) {
      unsigned char* flag = cuda.flags + list[i].record % kFlags;
      changed[i] = *flag != 0;
      *flag = 0;
    }
    if (h->pending->empty() && h->landing->empty()) *cuda.any = 0;
  }
  return changed;
}

// Wait for the streams the comparisons ran on, then the flags they left.
static std::vector<bool> changed_of(Hooks* h, const std::vector<Pending>& list) {
  for (auto& [device, stream] : *h->streams) {  // a legacy default stream (null) is its device's own
    OnDevice guard(device);
    cuda.cu.streamSynchronize(stream);
  }
  h->streams->clear();
  recycle();  // every kernel that touched a retired buffer has run
  return flags_of(h, list);
}

// The findings of list's changed entries; late: (frame, steps) the pass ended with, or nullptr (now).
static PyObject* judge(Hooks* h, std::vector<Pending>& list, const std::vector<bool>& changed, PyObject* late) {
  for (auto& e : list) h->statistics->erase(e.node.get());  // its nodes may go once their entries do
  PyObject* result = Py_None;
  std::vector<size_t> found;
  for (size_t i = 0; i < list.size(); ++i)
    if (changed[i] && list[i].used) found.push_back(i);
  std::sort(found.begin(), found.end(), [&](size_t a, size_t b) { return list[a].order < list[b].order; });
  for (size_t k = 0; k < found.size() && result; ++k) {
    Pending& e = list[found[k]];
    if (e.bn_own) {
      PyObject* res = PyObject_CallMethod(h->check, "_skip_saver", nullptr);
      Py_XDECREF(res);
      if (!res) result = nullptr;
      continue;
    }
    PyObject* facts = facts_object(h, e.facts);
    PyObject* original = e.original ? PyWeakref_GetObject(e.original) : Py_None;
    PyObject* node = facts ? node_object(e.node) : nullptr;
    PyObject* packed = node ? packed_of(e) : nullptr;
    PyObject* res = nullptr;
    if (packed && late)
      res = PyObject_CallMethod(h->check, "_changed_late", "OOOOOOO", packed, facts, original, node, Py_False,
                                PyTuple_GET_ITEM(late, 0), PyTuple_GET_ITEM(late, 1));
    else if (packed)
      res = PyObject_CallMethod(h->check, "_changed_late", "OOOO", packed, facts, original, node);
    Py_XDECREF(packed);
    Py_XDECREF(facts);
    Py_XDECREF(node);
    Py_XDECREF(res);
    if (!res) result = nullptr;
  }
  release(list);
  return result ? Py_NewRef(result) : nullptr;
}

// The passes ended whose comparisons have all run (wait: every one, waited for), judged in the order they
// ended; false: a callback raised.
bool settle(Hooks* h, bool wait) {
  while (!h->landing->empty()) {
    Landing& l = h->landing->front();
    for (auto& [device, event] : l.events) {
      OnDevice guard(device);
      if ((wait ? cuda.cu.eventSynchronize(event) : cuda.cu.eventQuery(event)) == kNotReady) return true;
    }
    Landing done = std::move(l);
    h->landing->pop_front();
    for (auto& [device, event] : done.events) cuda.devices[device.index()].events.push_back(event);
    recycle(done.retired);
    std::vector<bool> changed = flags_of(h, done.list);
    PyObject* res = judge(h, done.list, changed, done.late);
    Py_DECREF(done.late);
    if (!res) return false;
    Py_DECREF(res);
  }
  return true;
}

// An event of device's context, recorded on stream now; nullptr where the driver has none to give.
static CUevent event_on(const c10::Device& device, CUstream stream) {
  OnDevice guard(device);
  auto& spare = cuda.devices[device.index()].events;
  CUevent e = nullptr;
  if (!spare.empty()) {
    e = spare.back();
    spare.pop_back();
  } else if (cuda.cu.eventCreate(&e, 2)) {  // CU_EVENT_DISABLE_TIMING
    return nullptr;
  }
  if (cuda.cu.eventRecord(e, stream)) {
    spare.push_back(e);
    return nullptr;
  }
  return e;
}

// task's comparisons kept to read once they have run: false where an event could not be recorded (read now).
static bool land(Hooks* h, std::vector<Pending>& list, PyObject* late) {
  Landing l;
  for (auto& [device, stream] : *h->streams) {
    CUevent e = event_on(device, stream);
    if (!e) {
      for (auto& [d, done] : l.events) cuda.devices[d.index()].events.push_back(done);
      return false;
    }
    l.events.emplace_back(device, e);
  }
  h->streams->clear();
  l.retired = take_retired();  // every kernel on them ran before one of these events (or an earlier pass's)
  l.list = std::move(list);
  l.late = Py_NewRef(late);
  h->landing->push_back(std::move(l));
  return true;
}

// Read task's device comparisons: now (late nullptr: its streams waited for), or, with late (warn mode), once
// they have run, judged as of the pass's end (late: its backward call's frame and optimizer step count).
PyObject* flush_task(Hooks* h, int task, PyObject* late) {
  if (!settle(h, late == nullptr)) return nullptr;
  auto it = h->pending->find(task);
  if (it == h->pending->end()) Py_RETURN_NONE;
  std::vector<Pending> list = std::move(it->second);
  h->pending->erase(it);
  h->unasked->erase(std::remove(h->unasked->begin(), h->unasked->end(), task), h->unasked->end());
  if (late && land(h, list, late)) Py_RETURN_NONE;
  std::vector<bool> changed = changed_of(h, list);
  return judge(h, list, changed, late);
}

}  // namespace torchgen_patch_saved
