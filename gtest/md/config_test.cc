// UCX_GMD_* variables through UCX's real config parser.
#include <gtest/gtest.h>
#include <ucs/config/parser.h>

#include <cstdlib>
#include <cstring>
#include <string>

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
        ucs_config_parser_fill_opts(&config_, kMdConfigTable, "UCX_", kConfigPrefix, 0);
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
  EXPECT_EQ(kCudaFreeHooks, config_.cuda_free_mode);
  EXPECT_EQ(kDmabufTry, config_.dmabuf);
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
  ASSERT_EQ(UCS_OK, fill());
  std::string err;
  ASSERT_EQ(UCS_OK, validate(config_, &err)) << err;
  EXPECT_EQ(100u, cacheConfig(config_).max_regions);
  EXPECT_EQ(1ul << 30, cacheConfig(config_).max_pinned_bytes);
  EXPECT_EQ(64u * 1024, cacheConfig(config_).alignment);
  EXPECT_EQ(kCudaFreeValidate, config_.cuda_free_mode);
  EXPECT_EQ(kDmabufOff, config_.dmabuf);
  EXPECT_NE(0, config_.print_stats);
  EXPECT_NEAR(120e-9, config_.overhead, 1e-12);
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

}  // namespace
}  // namespace gmd::md
