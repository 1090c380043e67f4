#include "gtest/rxe/uct_fixture.h"

#include <dlfcn.h>
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cstring>

namespace gmd::test {
namespace {

class PluginEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    handle_ = dlopen(GMD_PLUGIN_PATH, RTLD_NOW | RTLD_GLOBAL);
    ASSERT_NE(nullptr, handle_) << dlerror();
  }

 private:
  void* handle_ = nullptr;  // never closed: libuct cannot forget a component
};

}  // namespace

bool loadGmdPluginFirst() {
  ::testing::AddGlobalTestEnvironment(new PluginEnvironment);
  return true;
}

uct_component_h findComponent(const char* name, std::vector<std::string>* md_names) {
  uct_component_h* comps = nullptr;
  unsigned n = 0;
  if (uct_query_components(&comps, &n) != UCS_OK) return nullptr;
  uct_component_h found = nullptr;
  for (unsigned i = 0; i < n && found == nullptr; ++i) {
    uct_component_attr_t attr{};
    attr.field_mask = UCT_COMPONENT_ATTR_FIELD_NAME | UCT_COMPONENT_ATTR_FIELD_MD_RESOURCE_COUNT;
    if (uct_component_query(comps[i], &attr) != UCS_OK || std::strcmp(attr.name, name) != 0) {
      continue;
    }
    if (md_names != nullptr) {
      std::vector<uct_md_resource_desc_t> res(attr.md_resource_count);
      attr.field_mask = UCT_COMPONENT_ATTR_FIELD_MD_RESOURCES;
      attr.md_resources = res.data();
      if (uct_component_query(comps[i], &attr) != UCS_OK) continue;
      for (const auto& r : res) md_names->push_back(r.md_name);
    }
    found = comps[i];
  }
  uct_release_component_list(comps);
  return found;
}

uct_md_h openMd(uct_component_h component, const std::string& md_name, ucs_status_t* status) {
  uct_md_config_t* config = nullptr;
  *status = uct_md_config_read(component, nullptr, nullptr, &config);
  if (*status != UCS_OK) return nullptr;
  uct_md_h md = nullptr;
  *status = uct_md_open(component, md_name.c_str(), config, &md);
  uct_config_release(config);
  return *status == UCS_OK ? md : nullptr;
}

Mapping::Mapping(std::size_t len) : length(len) {
  void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  addr = p == MAP_FAILED ? nullptr : static_cast<std::uint8_t*>(p);
}

Mapping::~Mapping() {
  if (addr != nullptr) munmap(addr, length);
}

}  // namespace gmd::test
