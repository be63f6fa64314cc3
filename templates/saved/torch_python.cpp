// torch's Python objects as the saved-tensor check's hooks read and make them (torch_python.h): the one part
// of them that includes torch's Python bindings.

#include "torch_python.h"

#include <torch/csrc/Device.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/autograd/python_cpp_function.h>
#include <torch/csrc/autograd/python_variable.h>

namespace torchgen_patch_saved __attribute__((visibility("hidden"))) {

bool is_tensor(PyObject* obj) { return THPVariable_Check(obj); }

const at::Tensor& tensor_of(PyObject* obj) { return THPVariable_Unpack(obj); }

PyObject* tensor_object(const at::Tensor& t) { return THPVariable_Wrap(t); }

PyObject* node_object(const decltype(torch::autograd::get_current_node())& node) {
  if (!node) Py_RETURN_NONE;
  return torch::autograd::functionToPyObject(node);
}

PyObject* device_object(const at::Device& device) { return THPDevice_New(device); }

PyObject* dtype_object(at::ScalarType dtype) { return (PyObject*)torch::getTHPDtype(dtype); }

}  // namespace torchgen_patch_saved
