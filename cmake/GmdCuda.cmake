# CUDA toolkit headers (never the driver library: libcuda.so.1 is dlopen'ed at run time).
# Sets GMD_HAVE_CUDA and the interface target gmd_cuda_headers.
string(TOUPPER "${GMD_WITH_CUDA}" _gmd_cuda)
set(GMD_HAVE_CUDA OFF)
add_library(gmd_cuda_headers INTERFACE)
if(NOT _gmd_cuda STREQUAL "OFF")
  find_path(GMD_CUDA_INCLUDE_DIR cuda.h
            HINTS ENV CUDA_HOME ENV CUDA_PATH /usr/local/cuda
            PATH_SUFFIXES include)
  if(GMD_CUDA_INCLUDE_DIR)
    set(GMD_HAVE_CUDA ON)
    target_include_directories(gmd_cuda_headers SYSTEM INTERFACE ${GMD_CUDA_INCLUDE_DIR})
    target_compile_definitions(gmd_cuda_headers INTERFACE GMD_HAVE_CUDA=1)
  elseif(_gmd_cuda STREQUAL "ON")
    message(FATAL_ERROR "GMD_WITH_CUDA=ON but cuda.h was not found (set CUDA_HOME)")
  endif()
elseif(NOT _gmd_cuda MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "GMD_WITH_CUDA must be AUTO, ON or OFF (got '${GMD_WITH_CUDA}')")
endif()
if(NOT GMD_HAVE_CUDA)
  target_compile_definitions(gmd_cuda_headers INTERFACE GMD_HAVE_CUDA=0)
endif()
