// gmd's mirror of the UCX component ABI for the UCX headers being compiled against (UCX 1.13 to
// 1.23, md/abi/layout.h). The CMake configure step refuses other UCX versions first
// (md/CMakeLists.txt); layout.h is the compile-time backstop. At load time md/component.cc checks
// the running UCX.
#pragma once

#include "md/abi/layout.h"
