// torch's Python objects as the saved-tensor check's hooks read and make them: tensors, autograd nodes,
// devices and dtypes. torch_python.cpp is the one part that includes torch's Python bindings (their headers
// cost every translation unit that includes them several seconds of compiling).

#pragma once

#include <Python.h>

#include "common.h"

#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/function.h>

namespace torchgen_patch_saved __attribute__((visibility("hidden"))) {

// Whether obj is a torch.Tensor (or a subclass's instance).
bool is_tensor(PyObject* obj);

// The tensor of obj, a torch.Tensor (valid while obj lives).
const at::Tensor& tensor_of(PyObject* obj);

// A new torch.Tensor of t (a new reference).
PyObject* tensor_object(const at::Tensor& t);

// The Python object of an autograd node (None where there is none; a new reference).
PyObject* node_object(const decltype(torch::autograd::get_current_node())& node);

// A new torch.device of device.
PyObject* device_object(const at::Device& device);

// The torch.dtype of dtype (a borrowed reference: dtypes live as long as torch).
PyObject* dtype_object(at::ScalarType dtype);

}  // namespace torchgen_patch_saved
