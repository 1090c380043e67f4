// Helpers for tests that drive gmd through the public UCT API, the way UCX 1.13 users reach it: the
// module is loaded before UCX is used (as LD_PRELOAD would), then found among UCX's components.
#pragma once

#include <uct/api/uct.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace gmd::test {

// Registers a gtest environment that dlopen's GMD_PLUGIN_PATH (the built libuct_gmd.so) before the
// first test; a test binary calls it once at namespace scope:
//   const bool kPluginLoaded = gmd::test::loadGmdPluginFirst();
bool loadGmdPluginFirst();

// UCX's component `name`, and the names of its MD resources. nullptr when it is not listed.
uct_component_h findComponent(const char* name, std::vector<std::string>* md_names = nullptr);

// uct_md_config_read + uct_md_open of `md_name`. nullptr and *status on failure.
uct_md_h openMd(uct_component_h component, const std::string& md_name, ucs_status_t* status);

// A private anonymous read-write mapping, unmapped on destruction (addr is nullptr if mmap failed).
struct Mapping {
  explicit Mapping(std::size_t len);
  ~Mapping();
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  std::uint8_t* addr;
  std::size_t length;
};

}  // namespace gmd::test
