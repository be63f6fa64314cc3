# TorchgenPatch.cmake: torchgen-patch as a codegen step of a CMake build.
#
#   list(APPEND CMAKE_MODULE_PATH <torchgen-patch>/cmake)
#   include(TorchgenPatch)
#   find_package(Torch REQUIRED)   # CMAKE_PREFIX_PATH from torch.utils.cmake_prefix_path
#   torchgen_patch_add_library(my_patch
#       [SHARDS n] [NATIVE_FUNCTIONS path] [TAGS path] [OVERLAY path] [REGISTER_AT_LOAD])
#
# At configure time the output list comes from `torchgen-patch gen --dry-run
# --output-dependencies`; at build time a custom command regenerates the
# sources whenever the yaml, the overlay or the templates change (gen writes
# only files whose content changed, so nothing recompiles needlessly).
# REGISTER_AT_LOAD registers every kernel from a static TORCH_LIBRARY_IMPL
# block when the library is loaded; without it, nothing is registered until
# torchgen_patch_register() is called (what torchgen_patch.install() does).
#
# TORCHGEN_PATCH_COMMAND: how to run the tool (default: torchgen-patch).

set(TORCHGEN_PATCH_COMMAND "torchgen-patch" CACHE STRING "Command that runs torchgen-patch")
get_filename_component(_TORCHGEN_PATCH_ROOT "${CMAKE_CURRENT_LIST_DIR}/.." ABSOLUTE)

function(torchgen_patch_add_library target)
  cmake_parse_arguments(TGP "REGISTER_AT_LOAD" "SHARDS;NATIVE_FUNCTIONS;TAGS;OVERLAY" "" ${ARGN})
  if(NOT TGP_SHARDS)
    set(TGP_SHARDS 2)
  endif()
  set(out "${CMAKE_CURRENT_BINARY_DIR}/${target}_generated")
  set(deps "${CMAKE_CURRENT_BINARY_DIR}/${target}_outputs.cmake")
  set(args gen --out "${out}" --shards ${TGP_SHARDS})
  set(inputs "")
  if(TGP_NATIVE_FUNCTIONS)
    list(APPEND args --native-functions "${TGP_NATIVE_FUNCTIONS}")
    list(APPEND inputs "${TGP_NATIVE_FUNCTIONS}")
  endif()
  if(TGP_TAGS)
    list(APPEND args --tags "${TGP_TAGS}")
    list(APPEND inputs "${TGP_TAGS}")
  endif()
  if(TGP_OVERLAY)
    list(APPEND args --overlay "${TGP_OVERLAY}")
    list(APPEND inputs "${TGP_OVERLAY}")
  endif()
  execute_process(
    COMMAND ${TORCHGEN_PATCH_COMMAND} ${args} --output-dependencies "${deps}" --dry-run
    RESULT_VARIABLE rc ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "torchgen-patch failed:\n${err}")
  endif()
  include("${deps}")
  file(GLOB templates "${_TORCHGEN_PATCH_ROOT}/templates/*.j2")
  add_custom_command(
    OUTPUT ${TORCHGEN_PATCH_OUTPUTS}
    COMMAND ${TORCHGEN_PATCH_COMMAND} ${args} --quiet
    DEPENDS ${inputs} ${templates}
    COMMENT "torchgen-patch: generating ADInplaceOrView kernels"
    VERBATIM)
  add_library(${target} SHARED ${TORCHGEN_PATCH_SOURCES})
  target_include_directories(${target} PRIVATE "${out}")
  target_link_libraries(${target} PRIVATE ${TORCH_LIBRARIES})
  # the C++ standard of the torch built against: its headers need C++20 from torch 2.13 on
  if(DEFINED Torch_VERSION AND Torch_VERSION VERSION_LESS "2.13")
    target_compile_features(${target} PRIVATE cxx_std_17)
  else()
    target_compile_features(${target} PRIVATE cxx_std_20)
  endif()
  if(TGP_REGISTER_AT_LOAD)
    target_compile_definitions(${target} PRIVATE TORCHGEN_PATCH_REGISTER_AT_LOAD)
  endif()
endfunction()
