// Selects gmd's mirror of the UCX component ABI for the UCX headers being compiled against.
// The CMake configure step refuses unknown UCX versions first (md/CMakeLists.txt); this is the
// compile-time backstop. At load time md/component.cc compares the running libuct's version.
#pragma once

#include <uct/api/version.h>

#if UCT_VERNO_MAJOR == 1 && UCT_VERNO_MINOR == 13
#include "md/abi/ucx_1_13.h"
#else
#error "gmd knows the component ABI of UCX 1.13 only (see md/abi/)"
#endif
