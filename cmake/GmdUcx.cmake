# UCX through pkg-config (ucx, ucx-uct, ucx-ucs) and libucm next to them; not through UCX's CMake
# package (Debian 13's ucx-config.cmake points its targets at a wrong include directory).
#
# Defines the imported targets ucx::ucp, ucx::uct, ucx::ucs and gmd_ucm, and
#   GMD_UCX_VERSION        e.g. 1.18.1, read from uct/api/version.h (the ABI gmd compiles against)
#   GMD_UCX_ABI            major.minor of it
#   GMD_UCX_LIBDIR         where libuct lives (pkg-config's libdir of ucx-uct)
# ucx_VERSION is kept as an alias of GMD_UCX_VERSION.
find_package(PkgConfig REQUIRED)
pkg_check_modules(GMD_PC_UCS REQUIRED ucx-ucs)
pkg_check_modules(GMD_PC_UCT REQUIRED ucx-uct)
pkg_check_modules(GMD_PC_UCP REQUIRED ucx)
pkg_get_variable(GMD_UCX_LIBDIR ucx-uct libdir)
pkg_get_variable(_gmd_ucx_includedir ucx-uct includedir)

# The libraries themselves, from pkg-config's libdir. libucm and libucs call each other: libucm comes
# first on a link line so that libucs resolves what it needs.
foreach(_lib ucm ucs uct ucp)
  find_library(GMD_${_lib}_LIBRARY NAMES ${_lib} HINTS ${GMD_UCX_LIBDIR} NO_DEFAULT_PATH)
  find_library(GMD_${_lib}_LIBRARY NAMES ${_lib} REQUIRED)
endforeach()
find_path(GMD_UCM_INCLUDE_DIR ucm/api/ucm.h HINTS ${_gmd_ucx_includedir} REQUIRED)
set(_gmd_ucs_libs ${GMD_ucm_LIBRARY} ${GMD_ucs_LIBRARY})
set(_gmd_uct_libs ${GMD_uct_LIBRARY})
set(_gmd_ucp_libs ${GMD_ucp_LIBRARY})
foreach(_lib ucs uct ucp)
  string(TOUPPER ${_lib} _LIB)
  if(NOT TARGET ucx::${_lib})
    add_library(ucx::${_lib} INTERFACE IMPORTED)
    target_include_directories(ucx::${_lib} INTERFACE ${GMD_PC_${_LIB}_INCLUDE_DIRS}
                                                      ${_gmd_ucx_includedir})
    target_link_libraries(ucx::${_lib} INTERFACE ${_gmd_${_lib}_libs})
  endif()
endforeach()
target_link_libraries(ucx::uct INTERFACE ucx::ucs)
target_link_libraries(ucx::ucp INTERFACE ucx::uct)

add_library(gmd_ucm INTERFACE)
target_link_libraries(gmd_ucm INTERFACE ucx::ucs)
target_include_directories(gmd_ucm INTERFACE ${GMD_UCM_INCLUDE_DIR})

find_file(GMD_UCT_VERSION_H uct/api/version.h HINTS ${_gmd_ucx_includedir} ${GMD_PC_UCT_INCLUDE_DIRS}
          REQUIRED)
file(STRINGS "${GMD_UCT_VERSION_H}" _gmd_ver REGEX "^#define UCT_VERNO_(MAJOR|MINOR|PATCH) ")
foreach(_part MAJOR MINOR PATCH)
  string(REGEX MATCH "UCT_VERNO_${_part} +([0-9]+)" _m "${_gmd_ver}")
  set(_gmd_ucx_${_part} ${CMAKE_MATCH_1})
endforeach()
if(_gmd_ucx_MAJOR STREQUAL "" OR _gmd_ucx_MINOR STREQUAL "")
  message(FATAL_ERROR "cannot read the UCX version from ${GMD_UCT_VERSION_H}")
endif()
set(GMD_UCX_VERSION "${_gmd_ucx_MAJOR}.${_gmd_ucx_MINOR}.${_gmd_ucx_PATCH}")
set(GMD_UCX_ABI "${_gmd_ucx_MAJOR}.${_gmd_ucx_MINOR}")
set(ucx_VERSION "${GMD_UCX_VERSION}")
if(NOT GMD_PC_UCT_VERSION VERSION_EQUAL GMD_UCX_VERSION)
  message(WARNING "pkg-config says UCX ${GMD_PC_UCT_VERSION} but ${GMD_UCT_VERSION_H} says "
                  "${GMD_UCX_VERSION}; building for the headers")
endif()
