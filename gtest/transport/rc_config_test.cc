// UCX_GMD_RC_* through UCX's real config parser, checked against a device and port described by
// hand (no device needed): every variable with a value that parses but makes no sense is refused
// with one line naming it; the defaults and sensible values pass.
#include "md/rc/rc_config.h"

#include <gtest/gtest.h>
#include <ucs/config/parser.h>
#include <ucs/sys/string.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "md/abi/config_parser.h"

namespace gmd::md::rc {
namespace {

class RcConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Limits of a small device, so "above a hardware limit" is easy to reach.
    dev_.max_qp = 1000;
    dev_.max_qp_wr = 1024;
    dev_.max_cqe = 8192;
    dev_.max_sge = 16;
    dev_.max_sge_rd = 16;
    dev_.max_qp_init_rd_atom = 16;
    dev_.max_qp_rd_atom = 16;
    dev_.max_srq_wr = 4096;
    port_.max_msg_sz = 1u << 30;
    port_.active_mtu = IBV_MTU_1024;
  }
  void TearDown() override {
    for (const auto& v : set_) unsetenv(v.c_str());
    if (filled_) ucs_config_parser_release_opts(&config_, kIfaceConfigTable);
  }
  // Fills the config as uct_md_iface_config_read does (UCX_ + GMD_RC_ prefixes), with `name` (no
  // prefix) set to `value` in the environment; nullptr name: defaults.
  ucs_status_t fill(const char* name = nullptr, const char* value = nullptr) {
    if (filled_) ucs_config_parser_release_opts(&config_, kIfaceConfigTable);
    for (const auto& v : set_) unsetenv(v.c_str());
    set_.clear();
    if (name != nullptr) {
      set_.push_back(std::string("UCX_") + kIfaceConfigPrefix + name);
      setenv(set_.back().c_str(), value, 1);
    }
    std::memset(&config_, 0, sizeof(config_));
    const ucs_status_t st =
        ucx::fillConfig(&config_, kIfaceConfigTable, sizeof(config_), "UCX_", kIfaceConfigPrefix);
    filled_ = st == UCS_OK;
    return st;
  }
  IfaceConfig config_{};
  bool filled_ = false;
  std::vector<std::string> set_;
  ibv_device_attr dev_{};
  ibv_port_attr port_{};
};

TEST_F(RcConfigTest, DefaultsPassAndRetryCountIsFiniteEverywhere) {
  ASSERT_EQ(UCS_OK, fill());
  std::string err;
  EXPECT_EQ(UCS_OK, validateConfig(config_, dev_, port_, &err)) << err;
  EXPECT_LE(config_.retry_count, 6u) << "7 is retry-forever on soft-RoCE";
  Limits l;
  ASSERT_EQ(UCS_OK, deriveLimits(config_, dev_, port_, "dev:1", &l));
  EXPECT_EQ(config_.retry_count, l.qp.retry_count);
  EXPECT_EQ(l.max_msg, l.max_read) << "hardware default: one READ per get";
}

TEST_F(RcConfigTest, SensibleValuesPass) {
  const std::vector<std::pair<const char*, const char*>> ok = {
      {"TX_QUEUE_LEN", "1024"}, {"TX_CQ_LEN", "8192"},  {"MAX_IOV", "32"},
      {"MAX_RD_ATOMIC", "64"},  {"MAX_READ", "inf"},    {"MAX_READ", "1g"},
      {"MAX_READ", "4k"},       {"TIMEOUT", "8ms"},     {"RETRY_COUNT", "0"},
      {"RETRY_COUNT", "6"},     {"CONNECT_TIMEOUT", "2s"}, {"LATENCY", "0"},
      {"OVERHEAD", "10ns"},     {"MAX_NUM_EPS", "inf"}, {"MAX_NUM_EPS", "1000"},
      {"RX_QUEUE_LEN", "2"},    {"RX_QUEUE_LEN", "4096"}, {"SEG_SIZE", "256"},
      {"SEG_SIZE", "64k"},      {"FC_WND_SIZE", "1"},   {"FC_WND_SIZE", "32768"},
      {"TX_BOUNCE", "1"},       {"TX_MAX_INLINE", "0"}, {"TX_MAX_INLINE", "1024"},
  };
  for (const auto& [name, value] : ok) {
    ASSERT_EQ(UCS_OK, fill(name, value)) << name << "=" << value;
    std::string err;
    EXPECT_EQ(UCS_OK, validateConfig(config_, dev_, port_, &err)) << name << "=" << value << ": " << err;
  }
  ASSERT_EQ(UCS_OK, fill("MAX_READ", "inf"));
  Limits l;
  ASSERT_EQ(UCS_OK, deriveLimits(config_, dev_, port_, "dev:1", &l));
  EXPECT_EQ(port_.max_msg_sz, l.max_read);
}

// Each value parses (UCX's parser takes it) but is refused, with one line that names the variable.
TEST_F(RcConfigTest, ValuesThatMakeNoSenseAreRefusedNamingTheVariable) {
  const std::vector<std::pair<const char*, const char*>> bad = {
      {"TX_QUEUE_LEN", "0"},      {"TX_QUEUE_LEN", "-5"},     {"TX_QUEUE_LEN", "1025"},
      {"TX_CQ_LEN", "0"},         {"TX_CQ_LEN", "-1"},        {"TX_CQ_LEN", "8193"},
      {"MAX_IOV", "0"},           {"MAX_IOV", "-5"},          {"MAX_IOV", "33"},
      {"MAX_RD_ATOMIC", "0"},     {"MAX_RD_ATOMIC", "-5"},    {"MAX_RD_ATOMIC", "256"},
      {"MAX_READ", "0"},          {"MAX_READ", "-5"},         {"MAX_READ", "2g"},
      {"TIMEOUT", "0"},           {"TIMEOUT", "-1s"},         {"TIMEOUT", "10000s"},
      {"RETRY_COUNT", "7"},       {"RETRY_COUNT", "-5"},
      {"CONNECT_TIMEOUT", "0"},   {"CONNECT_TIMEOUT", "-3s"}, {"CONNECT_TIMEOUT", "inf"},
      {"LATENCY", "-1us"},        {"LATENCY", "2s"},          {"OVERHEAD", "-75ns"},
      {"OVERHEAD", "nan"},        {"MAX_NUM_EPS", "0"},       {"MAX_NUM_EPS", "-5"},
      {"MAX_NUM_EPS", "1001"},
      {"RX_QUEUE_LEN", "1"},      {"RX_QUEUE_LEN", "-5"},     {"RX_QUEUE_LEN", "4097"},
      {"SEG_SIZE", "255"},        {"SEG_SIZE", "-5"},         {"SEG_SIZE", "2g"},
      {"FC_WND_SIZE", "0"},       {"FC_WND_SIZE", "32769"},   {"TX_BOUNCE", "0"},
      {"TX_BOUNCE", "-1"},        {"TX_MAX_INLINE", "1025"},  {"TX_MAX_INLINE", "-1"},
  };
  for (const auto& [name, value] : bad) {
    ASSERT_EQ(UCS_OK, fill(name, value)) << name << "=" << value << " should parse";
    std::string err;
    EXPECT_EQ(UCS_ERR_INVALID_PARAM, validateConfig(config_, dev_, port_, &err))
        << name << "=" << value << " was accepted";
    const std::string var = std::string("UCX_GMD_RC_") + name + "=";
    EXPECT_EQ(0u, err.find(var)) << "message does not start with " << var << ": " << err;
    EXPECT_NE(std::string::npos, err.find("accepted")) << err;
    EXPECT_EQ(std::string::npos, err.find('\n')) << "one line: " << err;
    Limits l;
    EXPECT_EQ(UCS_ERR_INVALID_PARAM, deriveLimits(config_, dev_, port_, "dev:1", &l))
        << name << "=" << value;
  }
}

// The example: -5 reads as 18446744073709551611 and used to be capped silently.
TEST_F(RcConfigTest, NegativeMaxReadIsRefusedNotCapped) {
  ASSERT_EQ(UCS_OK, fill("MAX_READ", "-5"));
  EXPECT_EQ(static_cast<std::size_t>(-5), config_.max_read) << "how UCX's size parser reads it";
  std::string err;
  EXPECT_EQ(UCS_ERR_INVALID_PARAM, validateConfig(config_, dev_, port_, &err));
  EXPECT_NE(std::string::npos, err.find("UCX_GMD_RC_MAX_READ=18446744073709551611")) << err;
  EXPECT_NE(std::string::npos, err.find("1073741824")) << "names the port's limit: " << err;
}

}  // namespace
}  // namespace gmd::md::rc
