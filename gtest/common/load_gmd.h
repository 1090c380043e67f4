// loadGmdComponent(path): dlopens gmd's plugin (never closed) and has UCX list its components, which
// is when gmd registers and decides about libucm's memory-type events; fails the calling test unless
// component gmd is listed. Call it through ASSERT_NO_FATAL_FAILURE.
#pragma once

#include <dlfcn.h>
#include <gtest/gtest.h>
#include <uct/api/uct.h>

#include <cstring>

namespace gmd::test {

inline void loadGmdComponent(const char* path) {
  void* plugin = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
  ASSERT_NE(nullptr, plugin) << dlerror();
  uct_component_h* comps = nullptr;
  unsigned n = 0;
  ASSERT_EQ(UCS_OK, uct_query_components(&comps, &n));
  bool found = false;
  for (unsigned i = 0; i < n; ++i) {
    uct_component_attr_t attr{};
    attr.field_mask = UCT_COMPONENT_ATTR_FIELD_NAME | UCT_COMPONENT_ATTR_FIELD_MD_RESOURCE_COUNT;
    ASSERT_EQ(UCS_OK, uct_component_query(comps[i], &attr));
    found = found || std::strcmp(attr.name, "gmd") == 0;
  }
  uct_release_component_list(comps);
  ASSERT_TRUE(found) << "component gmd not registered";
}

}  // namespace gmd::test
