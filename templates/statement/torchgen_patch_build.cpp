// The build this library is, stated by the library itself: read after dlopen, before registration
// (torchgen_patch/runtime/compile/key.py, build_problem). Compiled into every library torchgen-patch builds.
//
// torchgen_patch_build.h is the one generated line beside this file: TORCHGEN_PATCH_STATED, the JSON the
// building Python stated (the build key, and the torch it saw: version, git hash, C++ ABI, CUDA). What
// torch's headers and the compiler saw is added here, from the headers themselves.

#include <string>
#include <torch/version.h>

#include "torchgen_patch_build.h"

#define TORCHGEN_PATCH_STR2(x) #x
#define TORCHGEN_PATCH_STR(x) TORCHGEN_PATCH_STR2(x)
#if defined(_GLIBCXX_USE_CXX11_ABI) && _GLIBCXX_USE_CXX11_ABI
#define TORCHGEN_PATCH_ABI "true"
#elif defined(_GLIBCXX_USE_CXX11_ABI)
#define TORCHGEN_PATCH_ABI "false"
#else
#define TORCHGEN_PATCH_ABI "null"
#endif

extern "C" const char* torchgen_patch_build() {
  return "{\"stated\": " TORCHGEN_PATCH_STATED ", \"headers\": {\"version\": \""
      TORCHGEN_PATCH_STR(TORCH_VERSION_MAJOR) "." TORCHGEN_PATCH_STR(TORCH_VERSION_MINOR) "."
      TORCHGEN_PATCH_STR(TORCH_VERSION_PATCH) "\", \"cxx11_abi\": " TORCHGEN_PATCH_ABI "}}";
}
