// The saved-tensor check's native hooks: the one translation unit the library is compiled from. Each part
// below is a concern of its own, kept in its own file; compiled apart, each would parse torch's headers
// again (on 2 cores: about 54 CPU-seconds for the ten instead of 15 for this one). Every other .cpp of this
// folder is included here once, in name order (a test holds it); what a part keeps to itself is static.

#include "backward_end.cpp"
#include "cuda_driver.cpp"
#include "cuda_launch.cpp"
#include "fingerprint.cpp"
#include "module.cpp"
#include "pack.cpp"
#include "pending.cpp"
#include "records.cpp"
#include "torch_python.cpp"
#include "unpack.cpp"
