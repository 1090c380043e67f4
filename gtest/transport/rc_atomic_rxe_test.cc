// gmd_rc's 64-bit atomics through the public UCT API on real RDMA devices (soft-RoCE in the VM), rxe1 →
// rxe0 and rxe0 → rxe0 with the fixture of md/rc tests (rc_fixture.h): the advertised op set against
// the device's atomic capability, a known sequence (add, fetch-add returning the old value, compare-swap
// succeeding and failing, wrap-around), the operations verbs lacks refused, and fetch-adds from two
// endpoints at once summing right with every old value seen exactly once.
#include <gtest/gtest.h>
#include <infiniband/verbs.h>
#include <uct/api/uct.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gtest/rxe/uct_fixture.h"
#include "gtest/rxe/verbs_fixture.h"
#include "gtest/transport/rc_fixture.h"

namespace gmd::test {
namespace {

const bool kPluginLoaded = loadGmdPluginFirst();

// The device's own answer (ibv_device_attr.atomic_cap), independent of gmd.
ibv_atomic_cap deviceAtomicCap(const std::string& dev) {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  ibv_atomic_cap cap = IBV_ATOMIC_NONE;
  for (int i = 0; i < n; ++i) {
    if (dev != ibv_get_device_name(list[i])) continue;
    if (ibv_context* ctx = ibv_open_device(list[i]); ctx != nullptr) {
      ibv_device_attr a{};
      if (ibv_query_device(ctx, &a) == 0) cap = a.atomic_cap;
      ibv_close_device(ctx);
    }
  }
  ibv_free_device_list(list);
  return cap;
}

class GmdRcAtomic : public GmdRc {
 protected:
  void SetUp() override {
    GmdRc::SetUp();
    if (HasFatalFailure() || IsSkipped()) return;
    if (!(attr_.cap.flags & UCT_IFACE_FLAG_ATOMIC_DEVICE)) {
      GTEST_SKIP() << "the device offers no atomics";
    }
    // A page of 64-bit words, registered for atomics on the target.
    words_.assign(kPage / sizeof(std::uint64_t), 0);
    memh_ = nullptr;
    ASSERT_EQ(UCS_OK, uct_md_mem_reg(target_.md, words_.data(), kPage,
                                     UCT_MD_MEM_ACCESS_REMOTE_ATOMIC, &memh_));
    rkey_ = rkeyOf(target_.md, memh_);
  }
  void TearDown() override {
    if (memh_ != nullptr) {
      uct_rkey_release(comp_, &rkey_);
      uct_md_mem_dereg(target_.md, memh_);
    }
    GmdRc::TearDown();
  }

  std::uint64_t addr(std::size_t word) const {
    return reinterpret_cast<std::uint64_t>(words_.data() + word);
  }
  // Calls `op` until it stops returning UCS_ERR_NO_RESOURCE, progressing in between.
  template <typename Op>
  ucs_status_t retry(Op op) {
    ucs_status_t st;
    progressUntil([&] {
      st = op();
      return st != UCS_ERR_NO_RESOURCE;
    });
    return st;
  }
  // A fetching atomic waited for: its completion status.
  template <typename Op>
  ucs_status_t fetch(Op op) {
    Comp c;
    const ucs_status_t st = retry([&] { return op(&c.c); });
    if (st != UCS_INPROGRESS) return st;
    if (!progressUntil([&] { return c.calls > 0; })) return UCS_ERR_TIMED_OUT;
    EXPECT_EQ(1, c.calls);
    return c.last;
  }

  std::vector<std::uint64_t> words_;
  uct_mem_h memh_ = nullptr;
  uct_rkey_bundle_t rkey_{};
};

INSTANTIATE_TEST_SUITE_P(Devices, GmdRcAtomic, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? "CrossDevice" : "SameDevice";
                         });

// Without GmdRcAtomic's skip: the flags must follow the device whether or not it has atomics.
class GmdRcAtomicFlags : public GmdRc {};

INSTANTIATE_TEST_SUITE_P(Devices, GmdRcAtomicFlags, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? "CrossDevice" : "SameDevice";
                         });

TEST_P(GmdRcAtomicFlags, FollowTheDevice) {
  const auto devs = rdmaDeviceNames();
  const bool device_has = deviceAtomicCap(GetParam() ? devs[1] : devs[0]) != IBV_ATOMIC_NONE;
  EXPECT_EQ(device_has, (attr_.cap.flags & UCT_IFACE_FLAG_ATOMIC_DEVICE) != 0);
  EXPECT_EQ(0u, attr_.cap.flags & UCT_IFACE_FLAG_ATOMIC_CPU);
  const std::uint64_t ops = device_has ? UCS_BIT(UCT_ATOMIC_OP_ADD) : 0;
  const std::uint64_t fops =
      device_has ? UCS_BIT(UCT_ATOMIC_OP_ADD) | UCS_BIT(UCT_ATOMIC_OP_CSWAP) : 0;
  EXPECT_EQ(ops, attr_.cap.atomic64.op_flags);
  EXPECT_EQ(fops, attr_.cap.atomic64.fop_flags);
  EXPECT_EQ(0u, attr_.cap.atomic32.op_flags);
  EXPECT_EQ(0u, attr_.cap.atomic32.fop_flags);
}

TEST_P(GmdRcAtomic, KnownSequence) {
  const std::uint64_t kSentinel = 0xdeadbeefcafef00dULL;
  words_[3] = 5;
  words_[4] = 0x1122334455667788ULL;  // a neighbour that must stay as it is

  // add: no result, done once flushed.
  ASSERT_EQ(UCS_OK, retry([&] {
              return uct_ep_atomic64_post(ep_, UCT_ATOMIC_OP_ADD, 10, addr(3), rkey_.rkey);
            }));
  flushEp(ep_);
  EXPECT_EQ(15u, words_[3]);

  // fetch-add returns the old value.
  std::uint64_t result = kSentinel;
  ASSERT_EQ(UCS_OK, fetch([&](uct_completion_t* c) {
              return uct_ep_atomic64_fetch(ep_, UCT_ATOMIC_OP_ADD, 7, &result, addr(3), rkey_.rkey,
                                           c);
            }));
  EXPECT_EQ(15u, result);
  EXPECT_EQ(22u, words_[3]);

  // compare-swap that matches: swapped, returns the old value.
  result = kSentinel;
  ASSERT_EQ(UCS_OK, fetch([&](uct_completion_t* c) {
              return uct_ep_atomic_cswap64(ep_, 22, 0x100000000ULL, addr(3), rkey_.rkey, &result,
                                           c);
            }));
  EXPECT_EQ(22u, result);
  EXPECT_EQ(0x100000000ULL, words_[3]);

  // compare-swap that does not match: unchanged, returns the current value.
  result = kSentinel;
  ASSERT_EQ(UCS_OK, fetch([&](uct_completion_t* c) {
              return uct_ep_atomic_cswap64(ep_, 22, 5, addr(3), rkey_.rkey, &result, c);
            }));
  EXPECT_EQ(0x100000000ULL, result);
  EXPECT_EQ(0x100000000ULL, words_[3]);

  // Adding 2^64 - 1 wraps around (a subtraction of one), across the 32-bit halves.
  result = kSentinel;
  ASSERT_EQ(UCS_OK, fetch([&](uct_completion_t* c) {
              return uct_ep_atomic64_fetch(ep_, UCT_ATOMIC_OP_ADD, ~0ULL, &result, addr(3),
                                           rkey_.rkey, c);
            }));
  EXPECT_EQ(0x100000000ULL, result);
  EXPECT_EQ(0xffffffffULL, words_[3]);
  EXPECT_EQ(0x1122334455667788ULL, words_[4]);
  EXPECT_TRUE(failed_eps_.empty());
}

TEST_P(GmdRcAtomic, RefusesWhatVerbsLacks) {
  words_[0] = 42;
  std::uint64_t result = 7;
  std::uint32_t result32 = 7;
  Comp c;
  for (const uct_atomic_op_t op : {UCT_ATOMIC_OP_AND, UCT_ATOMIC_OP_OR, UCT_ATOMIC_OP_XOR}) {
    EXPECT_EQ(UCS_ERR_UNSUPPORTED, uct_ep_atomic64_post(ep_, op, 1, addr(0), rkey_.rkey)) << op;
  }
  for (const uct_atomic_op_t op :
       {UCT_ATOMIC_OP_SWAP, UCT_ATOMIC_OP_AND, UCT_ATOMIC_OP_OR, UCT_ATOMIC_OP_XOR}) {
    EXPECT_EQ(UCS_ERR_UNSUPPORTED,
              uct_ep_atomic64_fetch(ep_, op, 1, &result, addr(0), rkey_.rkey, &c.c))
        << op;
  }
  EXPECT_EQ(UCS_ERR_UNSUPPORTED, uct_ep_atomic32_post(ep_, UCT_ATOMIC_OP_ADD, 1, addr(0),
                                                      rkey_.rkey));
  EXPECT_EQ(UCS_ERR_UNSUPPORTED, uct_ep_atomic32_fetch(ep_, UCT_ATOMIC_OP_ADD, 1, &result32,
                                                       addr(0), rkey_.rkey, &c.c));
  EXPECT_EQ(UCS_ERR_UNSUPPORTED,
            uct_ep_atomic_cswap32(ep_, 1, 2, addr(0), rkey_.rkey, &result32, &c.c));
  // Not 8-byte aligned: refused before it reaches the device.
  EXPECT_EQ(UCS_ERR_INVALID_PARAM,
            uct_ep_atomic64_post(ep_, UCT_ATOMIC_OP_ADD, 1, addr(0) + 4, rkey_.rkey));
  EXPECT_EQ(UCS_ERR_INVALID_PARAM, uct_ep_atomic64_fetch(ep_, UCT_ATOMIC_OP_ADD, 1, &result,
                                                         addr(0) + 1, rkey_.rkey, &c.c));
  EXPECT_EQ(UCS_ERR_INVALID_PARAM,
            uct_ep_atomic_cswap64(ep_, 42, 1, addr(0) + 2, rkey_.rkey, &result, &c.c));
  flushEp(ep_);
  EXPECT_EQ(42u, words_[0]);
  EXPECT_EQ(7u, result);
  EXPECT_EQ(0, c.calls);
  EXPECT_TRUE(failed_eps_.empty());
}

TEST_P(GmdRcAtomic, ConcurrentFetchAddsFromTwoEndpoints) {
  constexpr std::size_t kEach = 400;
  constexpr std::uint64_t kStart = 1000;
  words_[8] = kStart;
  // The second initiator: the target's own iface (rxe0 → rxe0), beside ep_ (rxe1 or rxe0 → rxe0).
  uct_ep_h other = connect(target_, target_);
  extra_eps_.push_back(other);
  const uct_ep_h eps[2] = {ep_, other};
  std::vector<std::uint64_t> results(2 * kEach, ~0ULL);
  std::vector<std::unique_ptr<Comp>> comps;
  for (std::size_t i = 0; i < 2 * kEach; ++i) comps.push_back(std::make_unique<Comp>());
  std::size_t posted[2] = {0, 0};
  // Interleave the two endpoints, each posting as far as its resources allow.
  ASSERT_TRUE(progressUntil([&] {
    for (int e = 0; e < 2; ++e) {
      while (posted[e] < kEach) {
        const std::size_t i = e * kEach + posted[e];
        const ucs_status_t st = uct_ep_atomic64_fetch(eps[e], UCT_ATOMIC_OP_ADD, 1, &results[i],
                                                      addr(8), rkey_.rkey, &comps[i]->c);
        if (st == UCS_ERR_NO_RESOURCE) break;
        EXPECT_EQ(UCS_INPROGRESS, st) << ucs_status_string(st);
        if (st != UCS_INPROGRESS) return true;
        ++posted[e];
      }
    }
    return posted[0] == kEach && posted[1] == kEach;
  }));
  ASSERT_TRUE(progressUntil([&] {
    return std::all_of(comps.begin(), comps.end(), [](const auto& c) { return c->calls > 0; });
  })) << "not every fetch-add completed";
  for (const auto& c : comps) EXPECT_EQ(UCS_OK, c->last);
  EXPECT_EQ(kStart + 2 * kEach, words_[8]);
  // Every old value from kStart to kStart + 2 * kEach - 1, each exactly once.
  std::vector<std::uint64_t> sorted = results;
  std::sort(sorted.begin(), sorted.end());
  for (std::size_t i = 0; i < sorted.size(); ++i) {
    ASSERT_EQ(kStart + i, sorted[i]) << "old values seen: not a permutation";
  }
  // Each endpoint's own results increase (its fetch-adds execute in order).
  for (int e = 0; e < 2; ++e) {
    EXPECT_TRUE(std::is_sorted(results.begin() + e * kEach, results.begin() + (e + 1) * kEach));
  }
  EXPECT_TRUE(failed_eps_.empty());
}

}  // namespace
}  // namespace gmd::test
