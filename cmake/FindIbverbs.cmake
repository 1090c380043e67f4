# FindIbverbs: rdma-core's libibverbs (it ships no CMake package).
#
# Defines the imported target Ibverbs::ibverbs and Ibverbs_FOUND, and Ibverbs_HAVE_DMABUF when
# ibv_reg_dmabuf_mr is declared (rdma-core >= 34).
find_path(Ibverbs_INCLUDE_DIR infiniband/verbs.h)
find_library(Ibverbs_LIBRARY NAMES ibverbs)
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(Ibverbs REQUIRED_VARS Ibverbs_LIBRARY Ibverbs_INCLUDE_DIR)
if(Ibverbs_FOUND AND NOT TARGET Ibverbs::ibverbs)
  add_library(Ibverbs::ibverbs UNKNOWN IMPORTED)
  set_target_properties(Ibverbs::ibverbs PROPERTIES
    IMPORTED_LOCATION "${Ibverbs_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${Ibverbs_INCLUDE_DIR}")
  include(CheckSymbolExists)
  # The check links a program taking the function's address: it needs the library too. (The
  # result's name changed when the link was added, so that build trees holding the old, failed
  # answer ask again.)
  set(CMAKE_REQUIRED_INCLUDES "${Ibverbs_INCLUDE_DIR}")
  set(CMAKE_REQUIRED_LIBRARIES "${Ibverbs_LIBRARY}")
  check_symbol_exists(ibv_reg_dmabuf_mr infiniband/verbs.h Ibverbs_HAVE_REG_DMABUF_MR)
  unset(CMAKE_REQUIRED_LIBRARIES)
  unset(CMAKE_REQUIRED_INCLUDES)
  set(Ibverbs_HAVE_DMABUF "${Ibverbs_HAVE_REG_DMABUF_MR}")
endif()
mark_as_advanced(Ibverbs_INCLUDE_DIR Ibverbs_LIBRARY)
