// What the saved-tensor check keeps of a saved tensor as a Python object (the Packed type), and the frames
// of the program that saved it.

#include "records.h"

#include <frameobject.h>

#include <algorithm>

namespace torchgen_patch_saved __attribute__((visibility("hidden"))) {

int batching = 1;  // 0: one launch a tensor at use as well
PyTypeObject PackedType = {PyVarObject_HEAD_INIT(nullptr, 0)};
PyTypeObject HooksType = {PyVarObject_HEAD_INIT(nullptr, 0)};
int quiet = 0;  // > 0: unpack returns the tensor without a check (a lookup of the Python side)
PyObject* str_count = nullptr;

// ---- frames ---------------------------------------------------------------------------------------------

static int frame_offset(PyFrameObject* f) {
#if PY_VERSION_HEX >= 0x030B0000
  return PyFrame_GetLasti(f);
#else
  return f->f_lasti * 2;
#endif
}

static int kind_of(Hooks* h, PyCodeObject* code) {
  auto it = h->kinds->find((PyObject*)code);
  if (it != h->kinds->end()) return it->second;
  PyObject* k = PyObject_CallOneArg(h->kind, (PyObject*)code);
  int v = k ? (int)PyLong_AsLong(k) : 0;
  Py_XDECREF(k);
  PyErr_Clear();
  Py_INCREF(code);
  (*h->kinds)[(PyObject*)code] = v;
  return v;
}

const int kCalls = 4;  // attribute.CALLS: torch's code that calls a module's forward

// The innermost frame of the program's own code, the innermost outside torch and this package, and the
// innermost of the program's own code that no module's call runs (attribute.caller()'s three).
void capture(Hooks* h, Record* r) {
  PyFrameObject* f = PyEval_GetFrame();  // borrowed
  Py_XINCREF(f);
  while (f) {
    PyCodeObject* code = PyFrame_GetCode(f);
    int k = kind_of(h, code) & 3;
    if (k && !r->site) {
      r->site = (PyObject*)code;
      Py_INCREF(code);
      r->site_at = frame_offset(f);
    }
    PyFrameObject* back = PyFrame_GetBack(f);
    if (k == 2) {
      if (!r->program) {
        r->program = (PyObject*)code;
        Py_INCREF(code);
        r->program_at = frame_offset(f);
      }
      PyCodeObject* by = back ? PyFrame_GetCode(back) : nullptr;
      bool module = by && (kind_of(h, by) & kCalls);
      Py_XDECREF(by);
      if (!module) {
        r->call = (PyObject*)code;  // the reference PyFrame_GetCode gave
        r->call_at = frame_offset(f);
        Py_XDECREF(back);
        Py_DECREF(f);
        return;
      }
    }
    Py_DECREF(code);
    Py_DECREF(f);
    f = back;
  }
}

static PyObject* where_of(PyObject* code, int at) {
  if (!code) Py_RETURN_NONE;
  int line = PyCode_Addr2Line((PyCodeObject*)code, at);
  return Py_BuildValue("(Oi)", code, line);
}

// ---- Packed ---------------------------------------------------------------------------------------------

void packed_dealloc(Packed* p) {
  if (p->r && p->r->group) {  // first: releasing the tensor may run Python (weakref callbacks)
    auto& m = p->r->group->members;
    m.erase(std::remove(m.begin(), m.end(), p), m.end());
  }
  Py_XDECREF(p->ref);
  Py_XDECREF(p->original);
  if (p->r) {
    Py_XDECREF(p->r->program);
    Py_XDECREF(p->r->site);
    Py_XDECREF(p->r->call);
    Py_XDECREF(p->r->layout_name);
    delete p->r;
  }
  Py_TYPE(p)->tp_free((PyObject*)p);
}

Packed* new_packed() {
  Packed* p = PyObject_New(Packed, &PackedType);
  if (!p) return nullptr;
  p->ref = nullptr;
  p->original = nullptr;
  p->r = new Record();
  return p;
}

static PyObject* packed_get(Packed* p, void* which) {
  Record* r = p->r;
  switch ((intptr_t)which) {
    case 0: return Py_NewRef(p->ref ? p->ref : Py_None);
    case 1: return Py_NewRef(p->original ? p->original : Py_None);
    case 2: return PyLong_FromLongLong(r->version);
    case 3: return PyBool_FromLong(r->leaf);
    case 4: return PyBool_FromLong(r->output);
    case 5: return PyLong_FromLong(r->output_nr);
    case 6: {
      PyObject* a = where_of(r->program, r->program_at);
      PyObject* b = where_of(r->site, r->site_at);
      PyObject* c = where_of(r->call, r->call_at);
      return Py_BuildValue("(NNN)", a, b, c);
    }
    case 7: return PyLong_FromLongLong(r->steps);
    case 8: if (r->has_ptr) return PyLong_FromUnsignedLongLong(r->ptr); Py_RETURN_NONE;
  }
  Py_RETURN_NONE;
}

PyGetSetDef packed_getset[] = {
    {"ref", (getter)packed_get, nullptr, nullptr, (void*)0},
    {"original", (getter)packed_get, nullptr, nullptr, (void*)1},
    {"version", (getter)packed_get, nullptr, nullptr, (void*)2},
    {"leaf", (getter)packed_get, nullptr, nullptr, (void*)3},
    {"output", (getter)packed_get, nullptr, nullptr, (void*)4},
    {"output_nr", (getter)packed_get, nullptr, nullptr, (void*)5},
    {"where", (getter)packed_get, nullptr, nullptr, (void*)6},
    {"steps", (getter)packed_get, nullptr, nullptr, (void*)7},
    {"ptr", (getter)packed_get, nullptr, nullptr, (void*)8},
    {nullptr}};

}  // namespace torchgen_patch_saved
