// Selects gmd's mirror of the UCX component ABI for the UCX headers being compiled against.
// The CMake configure step refuses unknown UCX versions first (md/CMakeLists.txt); this is the
// compile-time backstop. At load time md/component.cc checks the running UCX.
#pragma once

#include <uct/api/version.h>

#if UCT_VERNO_MAJOR == 1 && UCT_VERNO_MINOR == 13
#include "md/abi/ucx_1_13.h"
#elif UCT_VERNO_MAJOR == 1 && UCT_VERNO_MINOR == 18
#include "md/abi/ucx_1_18.h"
#elif UCT_VERNO_MAJOR == 1 && (UCT_VERNO_MINOR == 22 || UCT_VERNO_MINOR == 23)
#include "md/abi/ucx_1_22.h"
#else
#error "gmd knows the component ABI of UCX 1.13, 1.18 and 1.22-1.23 only (see md/abi/)"
#endif
