# FindRdmacm: rdma-core's librdmacm (it ships no CMake package). Defines Rdmacm::rdmacm.
find_path(Rdmacm_INCLUDE_DIR rdma/rdma_cma.h)
find_library(Rdmacm_LIBRARY NAMES rdmacm)
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(Rdmacm REQUIRED_VARS Rdmacm_LIBRARY Rdmacm_INCLUDE_DIR)
if(Rdmacm_FOUND AND NOT TARGET Rdmacm::rdmacm)
  add_library(Rdmacm::rdmacm UNKNOWN IMPORTED)
  set_target_properties(Rdmacm::rdmacm PROPERTIES
    IMPORTED_LOCATION "${Rdmacm_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${Rdmacm_INCLUDE_DIR}")
endif()
mark_as_advanced(Rdmacm_INCLUDE_DIR Rdmacm_LIBRARY)
