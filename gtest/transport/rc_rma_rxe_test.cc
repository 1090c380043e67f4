// gmd_rc's small RMA through the public UCT API on real RDMA devices (soft-RoCE in the VM), rxe1 →
// rxe0 and rxe0 → rxe0 with the fixture of md/rc tests (rc_fixture.h): put_short, put_bcopy and
// get_bcopy at every size from 0 to the advertised limit with every byte (and the bytes around) checked,
// a length above the limit refused with nothing written or unpacked, and a get_bcopy through a bad
// remote key completing with an error and no unpack.
#include <gtest/gtest.h>
#include <uct/api/uct.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "gtest/rxe/uct_fixture.h"
#include "gtest/rxe/verbs_fixture.h"
#include "gtest/transport/rc_fixture.h"

namespace gmd::test {
namespace {

const bool kPluginLoaded = loadGmdPluginFirst();

class GmdRcRma : public GmdRc {
 protected:
  static constexpr std::size_t kGuard = 64;  // bytes checked untouched on each side
  static constexpr std::uint8_t kFill = 0xa5;

  // A registered remote buffer of `len` bytes plus guards, and its key.
  struct Remote {
    std::vector<std::uint8_t> bytes;
    uct_mem_h memh = nullptr;
    uct_rkey_bundle_t rkey{};
    std::uint8_t* data() { return bytes.data() + kGuard; }
    std::uint64_t addr(std::size_t off = 0) {
      return reinterpret_cast<std::uint64_t>(data() + off);
    }
  };
  void makeRemote(std::size_t len, Remote* r) {
    r->bytes.assign(len + 2 * kGuard, kFill);
    r->memh = reg(target_.md, r->bytes.data(), r->bytes.size());
    r->rkey = rkeyOf(target_.md, r->memh);
  }
  void dropRemote(Remote* r) {
    uct_rkey_release(comp_, &r->rkey);
    uct_md_mem_dereg(target_.md, r->memh);
  }

  // Every byte of `r`: `len` bytes equal to `want` at `off`, kFill everywhere else.
  ::testing::AssertionResult holds(Remote& r, std::size_t off, const std::uint8_t* want,
                                   std::size_t len) {
    for (std::size_t i = 0; i < r.bytes.size(); ++i) {
      const bool inside = i >= kGuard + off && i < kGuard + off + len;
      const std::uint8_t expect = inside ? want[i - kGuard - off] : kFill;
      if (r.bytes[i] != expect) {
        return ::testing::AssertionFailure()
               << "byte " << static_cast<long>(i) - static_cast<long>(kGuard + off) << " of a "
               << len << "-byte transfer: " << int{r.bytes[i]} << ", expected " << int{expect};
      }
    }
    return ::testing::AssertionSuccess();
  }

  static void pattern(std::vector<std::uint8_t>* v, std::size_t len, std::size_t seed) {
    v->resize(len);
    for (std::size_t i = 0; i < len; ++i) (*v)[i] = static_cast<std::uint8_t>(seed * 131 + i * 7 + 1);
  }

  // put(src, len, remote address, rkey) → bytes put or a status: every size 0..max at unaligned
  // offsets, each flushed and checked with its guards; then max + 1 refused, nothing written.
  template <typename Put>
  void putEverySize(std::size_t max, Put put) {
    Remote r;
    makeRemote(max + 8, &r);
    std::vector<std::uint8_t> src;
    for (std::size_t len = 0; len <= max; ++len) {
      const std::size_t off = (len * 3) % 8;
      pattern(&src, len, len + 5);
      ASSERT_EQ(static_cast<ssize_t>(len),
                retry([&] { return put(src.data(), len, r.addr(off), r.rkey.rkey); }))
          << len << " bytes";
      flushEp(ep_);
      ASSERT_TRUE(holds(r, off, src.data(), len));
      std::memset(r.data() + off, kFill, len);
    }
    pattern(&src, max + 1, 2);
    EXPECT_EQ(static_cast<ssize_t>(UCS_ERR_INVALID_PARAM),
              put(src.data(), max + 1, r.addr(), r.rkey.rkey));
    flushEp(ep_);
    EXPECT_TRUE(holds(r, 0, nullptr, 0));
    EXPECT_TRUE(failed_eps_.empty());
    dropRemote(&r);
  }

  // Calls `op` until it stops returning UCS_ERR_NO_RESOURCE, progressing in between.
  template <typename Op>
  auto retry(Op op) {
    decltype(op()) st;
    progressUntil([&] {
      st = op();
      return st != static_cast<decltype(st)>(UCS_ERR_NO_RESOURCE);
    });
    return st;
  }
};

struct PackArg {
  const std::uint8_t* data;
  std::size_t len;
};

size_t packBytes(void* dest, void* arg) {
  const auto* a = static_cast<const PackArg*>(arg);
  std::memcpy(dest, a->data, a->len);
  return a->len;
}

// get_bcopy's unpack target: records the bytes, the length and whether the completion had run.
struct Unpacked {
  std::vector<std::uint8_t> data;
  int calls = 0;
  std::size_t length = 0;
  const Comp* comp = nullptr;
  bool before_comp = false;
};

void unpackBytes(void* arg, const void* data, size_t length) {
  auto* u = static_cast<Unpacked*>(arg);
  ++u->calls;
  u->length = length;
  u->data.assign(static_cast<const std::uint8_t*>(data),
                 static_cast<const std::uint8_t*>(data) + length);
  u->before_comp = u->comp != nullptr && u->comp->calls == 0;
}

INSTANTIATE_TEST_SUITE_P(Devices, GmdRcRma, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? "CrossDevice" : "SameDevice";
                         });

TEST_P(GmdRcRma, AdvertisesHonestLimits) {
  const std::uint64_t need =
      UCT_IFACE_FLAG_PUT_SHORT | UCT_IFACE_FLAG_PUT_BCOPY | UCT_IFACE_FLAG_GET_BCOPY;
  EXPECT_EQ(need, attr_.cap.flags & need);
  EXPECT_EQ(0u, attr_.cap.flags & UCT_IFACE_FLAG_GET_SHORT);
  EXPECT_GE(attr_.cap.put.max_short, 8u);
  EXPECT_LE(attr_.cap.put.max_short, attr_.cap.put.max_bcopy);
  EXPECT_GE(attr_.cap.put.max_bcopy, 256u);  // UCP's RMA lane puts its small messages there
  EXPECT_GE(attr_.cap.get.max_bcopy, 256u);
  EXPECT_LE(attr_.cap.get.max_bcopy, attr_.cap.get.max_zcopy);
  EXPECT_LE(attr_.cap.put.max_bcopy, attr_.cap.put.max_zcopy);
  EXPECT_EQ(0u, attr_.cap.get.max_short);
}

TEST_P(GmdRcRma, PutShortEverySize) {
  putEverySize(attr_.cap.put.max_short, [&](const std::uint8_t* src, std::size_t len,
                                            std::uint64_t raddr, uct_rkey_t rkey) -> ssize_t {
    const ucs_status_t st =
        uct_ep_put_short(ep_, src, static_cast<unsigned>(len), raddr, rkey);
    return st == UCS_OK ? static_cast<ssize_t>(len) : static_cast<ssize_t>(st);
  });
}

TEST_P(GmdRcRma, PutBcopyEverySize) {
  // Above max_bcopy: a packer that writes one byte more.
  putEverySize(attr_.cap.put.max_bcopy, [&](const std::uint8_t* src, std::size_t len,
                                            std::uint64_t raddr, uct_rkey_t rkey) {
    PackArg a{src, len};
    return uct_ep_put_bcopy(ep_, packBytes, &a, raddr, rkey);
  });
}

TEST_P(GmdRcRma, GetBcopyEverySize) {
  const std::size_t max = attr_.cap.get.max_bcopy;
  Remote r;
  makeRemote(max + 8, &r);
  std::vector<std::uint8_t> want;
  for (std::size_t len = 0; len <= max; ++len) {
    const std::size_t off = (len * 5) % 8;
    pattern(&want, len, len + 9);
    std::memcpy(r.data() + off, want.data(), len);
    Comp c;
    Unpacked u;
    u.comp = &c;
    const ucs_status_t st = retry([&] {
      return uct_ep_get_bcopy(ep_, unpackBytes, &u, len, r.addr(off), r.rkey.rkey, &c.c);
    });
    ASSERT_TRUE(st == UCS_OK || st == UCS_INPROGRESS) << ucs_status_string(st);
    if (st == UCS_INPROGRESS) {
      ASSERT_TRUE(progressUntil([&] { return c.calls > 0; })) << "completion never called";
      EXPECT_EQ(UCS_OK, c.last);
      EXPECT_EQ(1, c.calls);
      EXPECT_TRUE(u.before_comp) << "unpack ran after the completion";
    }
    ASSERT_EQ(1, u.calls) << len << " bytes";
    ASSERT_EQ(len, u.length);
    ASSERT_EQ(want, u.data) << len << " bytes";
    std::memset(r.data() + off, kFill, len);
  }
  // One byte more than max_bcopy: refused, never unpacked.
  Comp c;
  Unpacked u;
  EXPECT_EQ(UCS_ERR_INVALID_PARAM,
            uct_ep_get_bcopy(ep_, unpackBytes, &u, max + 1, r.addr(), r.rkey.rkey, &c.c));
  flushEp(ep_);
  EXPECT_EQ(0, u.calls);
  EXPECT_EQ(0, c.calls);
  EXPECT_TRUE(failed_eps_.empty());
  dropRemote(&r);
}

TEST_P(GmdRcRma, GetBcopyThroughBadKeyFailsWithoutUnpack) {
  Remote r;
  makeRemote(256, &r);
  // A separate endpoint: the failed one is unusable afterwards.
  uct_ep_h victim = connect(init_, target_);
  Comp c;
  Unpacked u;
  u.comp = &c;
  const ucs_status_t st = retry([&] {
    return uct_ep_get_bcopy(victim, unpackBytes, &u, 128, r.addr(), r.rkey.rkey ^ 0x5a5a00u, &c.c);
  });
  ASSERT_EQ(UCS_INPROGRESS, st) << ucs_status_string(st);
  ASSERT_TRUE(progressUntil([&] { return c.calls > 0; })) << "completion never called";
  EXPECT_NE(UCS_OK, c.last);
  EXPECT_EQ(0, u.calls) << "a failed READ was unpacked";
  EXPECT_TRUE(progressUntil([&] { return !failed_eps_.empty(); }))
      << "the error handler was not called";
  uct_ep_destroy(victim);

  // The healthy endpoint still reads.
  std::vector<std::uint8_t> want;
  pattern(&want, 64, 3);
  std::memcpy(r.data(), want.data(), 64);
  Comp ok;
  Unpacked got;
  got.comp = &ok;
  ASSERT_EQ(UCS_INPROGRESS, retry([&] {
              return uct_ep_get_bcopy(ep_, unpackBytes, &got, 64, r.addr(), r.rkey.rkey, &ok.c);
            }));
  ASSERT_TRUE(progressUntil([&] { return ok.calls > 0; }));
  EXPECT_EQ(UCS_OK, ok.last);
  EXPECT_EQ(want, got.data);
  dropRemote(&r);
}

}  // namespace
}  // namespace gmd::test
