// The saved-tensor check's Hooks type (its methods besides pack and unpack) and the module: its functions and
// the one symbol the library exports, torchgen_patch_saved_module.

#include "hooks.h"


#include <dlfcn.h>

#include <chrono>
#include <cstring>
#include <exception>

namespace torchgen_patch_saved __attribute__((visibility("hidden"))) {

static PyObject* hooks_flush(Hooks* h, PyObject* args) {
  int task;
  PyObject* late = nullptr;
  if (!PyArg_ParseTuple(args, "i|O!", &task, &PyTuple_Type, &late)) return nullptr;
  if (late && PyTuple_GET_SIZE(late) != 2) return PyErr_Format(PyExc_TypeError, "late: (frame, steps)");
  try {
    return flush_task(h, task, late);
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
}

static PyObject* hooks_settle(Hooks* h, PyObject* wait) {
  try {
    if (!settle(h, PyObject_IsTrue(wait) == 1)) return nullptr;
    Py_RETURN_NONE;
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
}

static PyObject* hooks_tasks(Hooks* h, PyObject*) {
  PyObject* out = PyList_New(0);
  for (auto& [task, list] : *h->pending) {
    PyObject* n = PyLong_FromLong(task);
    PyList_Append(out, n);
    Py_DECREF(n);
  }
  return out;
}

static PyObject* hooks_counts(Hooks* h, PyObject*) {
  PyObject* out = PyDict_New();
  for (int i = 1; i < kReasons; ++i) {
    if (!h->skipped[i]) continue;
    PyObject* n = PyLong_FromLongLong(h->skipped[i]);
    PyObject* k = PyLong_FromLong(i);
    PyDict_SetItem(out, k, n);
    Py_DECREF(n);
    Py_DECREF(k);
  }
  return out;
}

static PyObject* hooks_device_status(Hooks*, PyObject*) {
  PyObject* out = PyDict_New();
  for (auto& [index, s] : cuda.devices) {
    PyObject* k = PyLong_FromLong(index);
    PyObject* v = PyUnicode_FromString(s.why.c_str());
    PyDict_SetItem(out, k, v);
    Py_DECREF(k);
    Py_DECREF(v);
  }
  return out;
}

static PyObject* hooks_fingerprint(Hooks* h, PyObject* obj) {  // the fingerprint of a plain tensor, as pack makes it
  if (!is_tensor(obj)) return PyErr_Format(PyExc_TypeError, "a tensor, not %s", Py_TYPE(obj)->tp_name);
  try {
    const at::Tensor& t = tensor_of(obj);
    Record r;
    if (reading(t, &r) < 0 || reading(t, &r) == 2 || !fingerprint_into(t, &r, h, nullptr, 0, nullptr))
      Py_RETURN_NONE;
    if (r.skip) Py_RETURN_NONE;
    if (r.host) return PyLong_FromUnsignedLongLong(r.fp);
    OnDevice guard(t.device());
    cuda.cu.streamSynchronize(current_stream(t.device()));
    u64 value = 0;
    CUresult rc = cuda.cu.memcpyDtoH(&value, (u64)(uintptr_t)r.device.address(), sizeof value);
    if (rc) return PyErr_Format(PyExc_RuntimeError, "cannot read the fingerprint: %s", cu_error(rc).c_str());
    return PyLong_FromUnsignedLongLong(value);
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
}

// Host seconds of n launches of t's fingerprint, or of a part of one: part 0 the whole launch() (any layout
// its kernels read), 1 what launch() does besides the driver's launch (device guard, stream, capture check,
// layout, slot), 2 the driver's launch alone (the dense kernel, its arguments made once; t dense).
static PyObject* hooks_launch_cost(Hooks* h, PyObject* args) {
  PyObject* obj;
  int n, part = 0;
  if (!PyArg_ParseTuple(args, "Oi|i", &obj, &n, &part)) return nullptr;
  try {
    const at::Tensor& t = tensor_of(obj);
    DeviceState* s = t.is_cuda() ? cuda_device(t.device()) : nullptr;
    if (!s || (part == 2 && !dense(t))) Py_RETURN_NONE;
    OnDevice outer(t.device());
    CUstream stream = current_stream(t.device());
    DeviceFingerprint f;
    slot_on(*s, t.device(), f);
    const unsigned char* base = static_cast<const unsigned char*>(t.const_data_ptr());
    u64 nbytes = (u64)(t.numel() * t.element_size()), seed = key.seed, cap = kFlags, record = 0;
    u64* slot = f.address();
    const u64* expect = nullptr;
    void *key_ptr = s->key.data_ptr(), *flags = cuda.flags, *any = const_cast<u32*>(cuda.any);
    void* fixed[] = {(void*)&base, (void*)&nbytes, &key_ptr, &seed, &slot, (void*)&expect, &record, &flags, &cap, &any};
    auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) {
      if (part == 2) {
        if (cuda.cu.launchKernel(s->dense, 1, 1, 1, 256, 1, 1, 0, stream, fixed, nullptr)) Py_RETURN_NONE;
        continue;
      }
      DeviceFingerprint g;
      if (part == 1) {
        OnDevice guard(t.device());
        CUstream st = current_stream(t.device());
        int capturing = 0;
        if (st && cuda.cu.streamIsCapturing(st, &capturing) == 0 && capturing) Py_RETURN_NONE;
        Layout l;
        if (!dense(t) && !collapse(t, l)) Py_RETURN_NONE;
        slot_on(*s, t.device(), g);
        continue;
      }
      if (!launch(t, *s, g, nullptr, 0, nullptr).empty()) Py_RETURN_NONE;
    }
    std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
    return PyFloat_FromDouble(took.count());
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
}

static PyObject* hooks_get(Hooks* h, void* which) {
  switch ((intptr_t)which) {
    case 0: return PyBool_FromLong(h->active);
    case 1: return PyLong_FromLongLong(h->checked);
    case 2: return PyLong_FromLongLong(h->unpacked);
    case 3: {
      size_t n = 0;
      for (auto& [task, list] : *h->pending)
        for (auto& e : list) n += e.used;
      return PyLong_FromSize_t(n);
    }
  }
  Py_RETURN_NONE;
}

static int hooks_set_active(Hooks* h, PyObject* value, void*) {
  int on = value ? PyObject_IsTrue(value) : 0;
  if (on < 0) return -1;
  h->active = on;
  return 0;
}

static int hooks_traverse(Hooks* h, visitproc visit, void* arg) {
  Py_VISIT(h->check);
  Py_VISIT(h->fallback);
  Py_VISIT(h->steps);
  Py_VISIT(h->kind);
  Py_VISIT(h->plain);
  return 0;
}

static int hooks_clear(Hooks* h) {
  Py_CLEAR(h->check);
  Py_CLEAR(h->fallback);
  Py_CLEAR(h->steps);
  Py_CLEAR(h->kind);
  Py_CLEAR(h->plain);
  return 0;
}

static void hooks_dealloc(Hooks* h) {
  PyObject_GC_UnTrack(h);
  for (auto& [task, list] : *h->pending) release(list);
  delete h->pending;
  for (Landing& l : *h->landing) {  // never judged: the check is gone
    release(l.list);
    Py_XDECREF(l.late);
    for (auto& [device, event] : l.events) cuda.devices[device.index()].events.push_back(event);
    for (SlotBuffer* b : l.retired) cuda.devices[b->device].retired.push_back(b);
  }
  delete h->landing;
  delete h->streams;
  for (auto& [code, kind] : *h->kinds) Py_DECREF(code);
  delete h->kinds;
  delete h->statistics;
  delete h->group;
  delete h->unasked;
  Py_XDECREF(h->check);
  Py_XDECREF(h->fallback);
  Py_XDECREF(h->steps);
  Py_XDECREF(h->kind);
  Py_XDECREF(h->plain);
  Py_TYPE(h)->tp_free((PyObject*)h);
}

static PyObject* hooks_new(PyTypeObject* type, PyObject* args, PyObject*) {
  PyObject *check, *fallback, *steps, *kind, *plain;
  if (!PyArg_ParseTuple(args, "OOOOO!", &check, &fallback, &steps, &kind, &PyTuple_Type, &plain)) return nullptr;
  if (!keyed) return PyErr_Format(PyExc_RuntimeError, "the check's key is not set (set_key)");
  Hooks* h = (Hooks*)type->tp_alloc(type, 0);
  if (!h) return nullptr;
  h->check = Py_NewRef(check);
  h->fallback = Py_NewRef(fallback);
  h->steps = Py_NewRef(steps);
  h->kind = Py_NewRef(kind);
  h->plain = Py_NewRef(plain);
  h->active = false;
  h->checked = h->unpacked = 0;
  std::memset(h->skipped, 0, sizeof h->skipped);
  h->pending = new std::unordered_map<int, std::vector<Pending>>();
  h->streams = new Streams();
  h->landing = new std::deque<Landing>();
  h->kinds = new std::unordered_map<PyObject*, int>();
  h->statistics = new std::unordered_map<const void*, std::vector<u64>>();
  h->next_record = 0;
  h->group = new std::shared_ptr<Group>();
  h->group_sequence = 0;
  h->group_thread = 0;
  h->uses = 0;
  h->unasked = new std::vector<int>();
  return (PyObject*)h;
}

static PyMethodDef hooks_methods[] = {
    {"pack", (PyCFunction)hooks_pack, METH_O, "autograd's pack hook"},
    {"unpack", (PyCFunction)hooks_unpack, METH_O, "autograd's unpack hook"},
    {"flush", (PyCFunction)hooks_flush, METH_VARARGS, "read the device comparisons of a backward pass (its graph "
     "task): now, or with (frame, steps) once they have run"},
    {"settle", (PyCFunction)hooks_settle, METH_O, "judge the passes whose comparisons have run (True: wait for all)"},
    {"tasks", (PyCFunction)hooks_tasks, METH_NOARGS, "the graph tasks with comparisons waiting"},
    {"counts", (PyCFunction)hooks_counts, METH_NOARGS, "tensors not judged, by reason code"},
    {"devices", (PyCFunction)hooks_device_status, METH_NOARGS, "CUDA devices seen: why the kernel is not used ('')"},
    {"fingerprint", (PyCFunction)hooks_fingerprint, METH_O, "a tensor's fingerprint, as pack makes it (or None)"},
    {"launch_cost", (PyCFunction)hooks_launch_cost, METH_VARARGS, "host seconds of n launches of a CUDA tensor's "
     "fingerprint (None: not launched)"},
    {nullptr}};

static PyGetSetDef hooks_getset[] = {
    {"active", (getter)hooks_get, (setter)hooks_set_active, nullptr, (void*)0},
    {"checked", (getter)hooks_get, nullptr, nullptr, (void*)1},
    {"unpacked", (getter)hooks_get, nullptr, nullptr, (void*)2},
    {"pending", (getter)hooks_get, nullptr, nullptr, (void*)3},
    {nullptr}};

// ---- the module -----------------------------------------------------------------------------------------

static PyObject* set_key(PyObject*, PyObject* arg) {
  char* data = nullptr;
  Py_ssize_t size = 0;
  if (PyBytes_AsStringAndSize(arg, &data, &size) < 0) return nullptr;
  if (size != (Py_ssize_t)(sizeof key.nh + sizeof key.seed))
    return PyErr_Format(PyExc_ValueError, "a key is %d bytes", (int)(sizeof key.nh + sizeof key.seed));
  std::memcpy(key.nh, data, sizeof key.nh);
  std::memcpy(&key.seed, data + sizeof key.nh, sizeof key.seed);
  keyed = true;
  cuda.devices.clear();  // their copies of the key are made again
  Py_RETURN_NONE;
}

static PyObject* set_cuda(PyObject*, PyObject* args) {
  const char *source, *nvrtc;
  if (!PyArg_ParseTuple(args, "ss", &source, &nvrtc)) return nullptr;
  cuda.source = source;
  cuda.nvrtc_path = nvrtc;
  if (*nvrtc && !cuda.nvrtc) {  // now, while the descriptor named is the file that was checked
    cuda.nvrtc = dlopen(nvrtc, RTLD_NOW | RTLD_LOCAL);
    if (!cuda.nvrtc) cuda.why = std::string("NVRTC does not load: ") + dlerror();
  }
  Py_RETURN_NONE;
}

static PyObject* set_quiet(PyObject*, PyObject* arg) {
  quiet += PyObject_IsTrue(arg) ? 1 : -1;
  Py_RETURN_NONE;
}

static PyObject* vector_unit(PyObject*, PyObject*) { return PyUnicode_FromString(nh_name); }

static PyObject* set_batching(PyObject*, PyObject* arg) {
  int on = PyObject_IsTrue(arg);
  if (on < 0) return nullptr;
  batching = on;
  Py_RETURN_NONE;
}

static PyObject* launch_count(PyObject*, PyObject*) { return PyLong_FromLongLong(launches); }

static PyObject* last_launch_error(PyObject*, PyObject*) { return PyUnicode_FromString(launch_error.c_str()); }

static PyMethodDef module_methods[] = {
    {"set_key", set_key, METH_O, "the process's key: 256 words of NH key and a 64-bit seed, as bytes"},
    {"set_cuda", set_cuda, METH_VARARGS, "the fingerprint kernel's CUDA source and the NVRTC library to compile it"},
    {"quiet", set_quiet, METH_O, "True: unpack returns tensors unchecked until quiet(False)"},
    {"vector_unit", vector_unit, METH_NOARGS, "what the CPU fingerprint runs on: 'avx2' or 'scalar'"},
    {"batching", set_batching, METH_O, "False: at use, one launch a tensor (True, the default: one a node)"},
    {"launches", launch_count, METH_NOARGS, "the fingerprint kernel's launches in this process"},
    {"launch_error", last_launch_error, METH_NOARGS, "why the last launch that failed did ('': none failed)"},
    {nullptr}};

static PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "torchgen_patch_saved",
                                 "the saved-tensor check's native hooks", -1, module_methods};

}  // namespace torchgen_patch_saved

extern "C" __attribute__((visibility("default"))) PyObject* torchgen_patch_saved_module() {
  using namespace torchgen_patch_saved;
  choose_nh();
  str_count = PyUnicode_InternFromString("count");
  PackedType.tp_name = "torchgen_patch_saved.Packed";
  PackedType.tp_basicsize = sizeof(Packed);
  PackedType.tp_flags = Py_TPFLAGS_DEFAULT;
  PackedType.tp_dealloc = (destructor)packed_dealloc;
  PackedType.tp_getset = packed_getset;
  PackedType.tp_doc = "what the check keeps of one saved tensor";
  HooksType.tp_name = "torchgen_patch_saved.Hooks";
  HooksType.tp_basicsize = sizeof(Hooks);
  HooksType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC;  // a Check holds its hooks, they hold the Check
  HooksType.tp_traverse = (traverseproc)hooks_traverse;
  HooksType.tp_clear = (inquiry)hooks_clear;
  HooksType.tp_dealloc = (destructor)hooks_dealloc;
  HooksType.tp_methods = hooks_methods;
  HooksType.tp_getset = hooks_getset;
  HooksType.tp_new = hooks_new;
  HooksType.tp_doc = "Hooks(check, fallback, steps, kind, plain): the pack and unpack hooks of one check";
  if (PyType_Ready(&PackedType) < 0 || PyType_Ready(&HooksType) < 0) return nullptr;
  PyObject* m = PyModule_Create(&module_def);
  if (!m) return nullptr;
  Py_INCREF(&HooksType);
  PyModule_AddObject(m, "Hooks", (PyObject*)&HooksType);
  Py_INCREF(&PackedType);
  PyModule_AddObject(m, "Packed", (PyObject*)&PackedType);
  PyModule_AddIntConstant(m, "BLOCK_WORDS", kWords);
  return m;
}
