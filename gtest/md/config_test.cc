// UCX_GMD_* variables through UCX's real config parser.
#include <gtest/gtest.h>
#include <ucs/config/parser.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "md/abi/config_parser.h"
#include "md/md_config.h"

namespace gmd::md {
namespace {

class MdConfigTest : public ::testing::Test {
 protected:
  void TearDown() override {
    for (const auto& v : set_) unsetenv(v.c_str());
    if (filled_) ucs_config_parser_release_opts(&config_, kMdConfigTable);
  }
  void setVar(const std::string& name, const char* value) {
    setenv(name.c_str(), value, 1);
    set_.push_back(name);
  }
  ucs_status_t fill() {
    if (filled_) ucs_config_parser_release_opts(&config_, kMdConfigTable);
    std::memset(&config_, 0, sizeof(config_));
    const ucs_status_t st =
        ucx::fillConfig(&config_, kMdConfigTable, sizeof(config_), "UCX_", kConfigPrefix);
    filled_ = st == UCS_OK;
    return st;
  }
  MdConfig config_{};
  bool filled_ = false;
  std::vector<std::string> set_;
};

TEST_F(MdConfigTest, DefaultsParseAndValidate) {
  ASSERT_EQ(UCS_OK, fill());
  std::string err;
  EXPECT_EQ(UCS_OK, validate(config_, &err)) << err;
  EXPECT_EQ(4096u, config_.alignment);
  EXPECT_EQ(512ul << 20, config_.max_unused);
  EXPECT_EQ(1000u, config_.event_prio);
  EXPECT_EQ(memtype::FreeMode::kHooks, freeMode(config_));
  EXPECT_EQ(DmabufPolicy::kTry, dmabufPolicy(config_));
  EXPECT_EQ(ManagedPolicy::kRefuse, managedPolicy(config_));
  EXPECT_EQ(0, config_.print_stats);
  EXPECT_NE(0, config_.purge_on_fork);
  const rcache::Config c = cacheConfig(config_);
  EXPECT_EQ(SIZE_MAX, c.max_regions) << "inf maps to no limit";
  EXPECT_EQ(SIZE_MAX, c.max_pinned_bytes);
  EXPECT_EQ(512ul << 20, c.max_unused_bytes);
}

TEST_F(MdConfigTest, VariablesAreReadWithGmdPrefix) {
  setVar("UCX_GMD_RCACHE_MAX_REGIONS", "100");
  setVar("UCX_GMD_RCACHE_MAX_SIZE", "1G");
  setVar("UCX_GMD_RCACHE_ADDR_ALIGN", "64K");
  setVar("UCX_GMD_CUDA_FREE_MODE", "validate");
  setVar("UCX_GMD_DMABUF", "off");
  setVar("UCX_GMD_PRINT_STATS", "y");
  setVar("UCX_GMD_RCACHE_OVERHEAD", "120ns");
  setVar("UCX_GMD_CUDA_MANAGED", "host-pages");
  ASSERT_EQ(UCS_OK, fill());
  std::string err;
  ASSERT_EQ(UCS_OK, validate(config_, &err)) << err;
  EXPECT_EQ(100u, cacheConfig(config_).max_regions);
  EXPECT_EQ(1ul << 30, cacheConfig(config_).max_pinned_bytes);
  EXPECT_EQ(64u * 1024, cacheConfig(config_).alignment);
  EXPECT_EQ(memtype::FreeMode::kValidate, freeMode(config_));
  EXPECT_EQ(DmabufPolicy::kOff, dmabufPolicy(config_));
  EXPECT_NE(0, config_.print_stats);
  EXPECT_NEAR(120e-9, config_.overhead, 1e-12);
  EXPECT_EQ(ManagedPolicy::kHostPages, managedPolicy(config_));
}

TEST_F(MdConfigTest, SyntaxErrorsAreRejectedByTheParser) {
  setVar("UCX_GMD_CUDA_FREE_MODE", "sometimes");
  EXPECT_NE(UCS_OK, fill());
}

TEST_F(MdConfigTest, BadAlignmentIsRejectedNamingTheVariable) {
  for (const char* v : {"3000", "1024", "2G"}) {
    setVar("UCX_GMD_RCACHE_ADDR_ALIGN", v);
    ASSERT_EQ(UCS_OK, fill()) << v;
    std::string err;
    EXPECT_EQ(UCS_ERR_INVALID_PARAM, validate(config_, &err)) << v;
    EXPECT_NE(std::string::npos, err.find("UCX_GMD_RCACHE_ADDR_ALIGN")) << err;
  }
}

TEST_F(MdConfigTest, ZeroRegionsOrTinyPinnedLimitIsRejected) {
  setVar("UCX_GMD_RCACHE_MAX_REGIONS", "0");
  ASSERT_EQ(UCS_OK, fill());
  std::string err;
  EXPECT_EQ(UCS_ERR_INVALID_PARAM, validate(config_, &err));
  EXPECT_NE(std::string::npos, err.find("UCX_GMD_RCACHE_MAX_REGIONS")) << err;
  setVar("UCX_GMD_RCACHE_MAX_REGIONS", "10");
  setVar("UCX_GMD_RCACHE_MAX_SIZE", "100");
  ASSERT_EQ(UCS_OK, fill());
  EXPECT_EQ(UCS_ERR_INVALID_PARAM, validate(config_, &err));
  EXPECT_NE(std::string::npos, err.find("UCX_GMD_RCACHE_MAX_SIZE")) << err;
}

// Every enum value parses to its enum, through UCX's parser and the one name table (no name ->
// string -> enum round trip anywhere).
TEST_F(MdConfigTest, EveryEnumNameParsesToItsValue) {
  for (unsigned i = 0; memtype::kFreeModeNames[i] != nullptr; ++i) {
    setVar("UCX_GMD_CUDA_FREE_MODE", memtype::kFreeModeNames[i]);
    ASSERT_EQ(UCS_OK, fill()) << memtype::kFreeModeNames[i];
    EXPECT_EQ(static_cast<memtype::FreeMode>(i), freeMode(config_));
  }
  for (unsigned i = 0; kDmabufPolicyNames[i] != nullptr; ++i) {
    setVar("UCX_GMD_DMABUF", kDmabufPolicyNames[i]);
    ASSERT_EQ(UCS_OK, fill()) << kDmabufPolicyNames[i];
    EXPECT_EQ(static_cast<DmabufPolicy>(i), dmabufPolicy(config_));
  }
  for (unsigned i = 0; kManagedPolicyNames[i] != nullptr; ++i) {
    setVar("UCX_GMD_CUDA_MANAGED", kManagedPolicyNames[i]);
    ASSERT_EQ(UCS_OK, fill()) << kManagedPolicyNames[i];
    EXPECT_EQ(static_cast<ManagedPolicy>(i), managedPolicy(config_));
  }
  setVar("UCX_GMD_CUDA_FREE_MODE", "both");
  ASSERT_EQ(UCS_OK, fill());
  EXPECT_EQ(memtype::FreeMode::kHooksAndValidate, freeMode(config_));
  setVar("UCX_GMD_CUDA_MANAGED", "always");
  EXPECT_NE(UCS_OK, fill()) << "not a value of the enum";
}

// Values that parse but make no sense, one variable at a time: each is refused with one line that
// names the variable, repeats the value and says what is accepted.
TEST_F(MdConfigTest, NonsenseValuesAreRefusedNamingTheVariableAndWhatIsAccepted) {
  struct Case {
    const char* var;
    const char* value;
  };
  const Case cases[] = {
      {"RCACHE_MAX_REGIONS", "0"},              // zero regions: nothing could be registered
      {"RCACHE_MAX_REGIONS", "2000000000000"},  // above the cache's limit (2^40)
      {"RCACHE_MAX_REGIONS", "auto"},           // there is no automatic choice
      {"RCACHE_MAX_SIZE", "100"},               // smaller than one aligned registration
      {"RCACHE_MAX_SIZE", "0"},                 // zero
      {"RCACHE_MAX_SIZE", "auto"},
      {"RCACHE_MAX_UNUSED", "auto"},
      {"RCACHE_MAX_UNUSED", "1000000000000000000"},  // above any address space (2^57)
      {"RCACHE_ADDR_ALIGN", "0"},
      {"RCACHE_ADDR_ALIGN", "3000"},      // not a power of two
      {"RCACHE_ADDR_ALIGN", "2G"},        // above 1G
      {"RCACHE_MEM_PRIO", "3000000000"},  // above INT_MAX: libucm takes an int
      {"RCACHE_OVERHEAD", "-5ns"},        // negative
      {"RCACHE_OVERHEAD", "2s"},          // a hit that costs seconds
  };
  for (const Case& c : cases) {
    const std::string var = std::string("UCX_GMD_") + c.var;
    setVar(var, c.value);
    ASSERT_EQ(UCS_OK, fill()) << var << "=" << c.value << " must parse";
    std::string err;
    EXPECT_EQ(UCS_ERR_INVALID_PARAM, validate(config_, &err)) << var << "=" << c.value;
    EXPECT_EQ(0u, err.find(var + "=")) << err;
    EXPECT_NE(std::string::npos, err.find("accepted: ")) << err;
    EXPECT_EQ(std::string::npos, err.find('\n')) << "one line: " << err;
    unsetenv(var.c_str());
  }
  // The limits themselves are accepted.
  setVar("UCX_GMD_RCACHE_MAX_REGIONS", "1099511627776");
  setVar("UCX_GMD_RCACHE_MAX_SIZE", "4096");
  setVar("UCX_GMD_RCACHE_MAX_UNUSED", "0");
  setVar("UCX_GMD_RCACHE_MEM_PRIO", "2147483647");
  setVar("UCX_GMD_RCACHE_OVERHEAD", "0");
  ASSERT_EQ(UCS_OK, fill());
  std::string err;
  EXPECT_EQ(UCS_OK, validate(config_, &err)) << err;
}

// Enum fields that no parse can produce (a config built by hand) are refused too.
TEST_F(MdConfigTest, OutOfRangeEnumFieldsAreRefused) {
  ASSERT_EQ(UCS_OK, fill());
  std::string err;
  for (unsigned MdConfig::*field :
       {&MdConfig::cuda_free_mode, &MdConfig::dmabuf, &MdConfig::cuda_managed}) {
    MdConfig c = config_;
    c.*field = 7;
    EXPECT_EQ(UCS_ERR_INVALID_PARAM, validate(c, &err));
    EXPECT_EQ(0u, err.find("UCX_GMD_")) << err;
  }
}

}  // namespace
}  // namespace gmd::md
