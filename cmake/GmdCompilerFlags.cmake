# Warnings and sanitizers for every gmd target (included from the top-level CMakeLists.txt).
add_compile_options(-Wall -Wextra -Wshadow -Wno-missing-field-initializers)
if(GMD_WERROR)
  add_compile_options(-Werror)
endif()

if(GMD_ENABLE_TSAN AND (GMD_ENABLE_ASAN OR GMD_ENABLE_UBSAN))
  message(FATAL_ERROR "GMD_ENABLE_TSAN cannot be combined with GMD_ENABLE_ASAN or GMD_ENABLE_UBSAN")
endif()
set(_gmd_sanitizers "")
if(GMD_ENABLE_ASAN)
  list(APPEND _gmd_sanitizers address)
endif()
if(GMD_ENABLE_UBSAN)
  list(APPEND _gmd_sanitizers undefined)
endif()
if(GMD_ENABLE_TSAN)
  list(APPEND _gmd_sanitizers thread)
endif()
if(_gmd_sanitizers)
  list(JOIN _gmd_sanitizers "," _gmd_san)
  add_compile_options(-fsanitize=${_gmd_san} -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
  add_link_options(-fsanitize=${_gmd_san})
  set(GMD_SANITIZED ON)
else()
  set(GMD_SANITIZED OFF)
endif()

# Sanitizer builds at -O1, as the sanitizers' own documentation advises: reports stay exact and the
# instrumented code compiles in about half the time of -O2.
if(_gmd_sanitizers)
  add_compile_options(-O1)
endif()

# The test binaries (everything under gtest/) get these flags after the build type's. -O1 -g1 (line
# tables: failures and sanitizer reports still name file and line) compiles them in about 55% of the
# time of -O2 -g, 45% under ASan; the code under test (common/, memtype/, rcache/, md/) and the
# benchmarks keep the build type's flags. Set it empty for a test build you step through in a debugger.
set(GMD_TEST_CXX_FLAGS "-O1 -g1" CACHE STRING
    "Compiler flags for the test binaries, after the build type's (empty: the build type's alone)")
