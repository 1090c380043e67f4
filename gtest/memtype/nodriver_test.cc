// memtype/ where CUDA is absent: no driver library, a driver without devices, or a build with
// GMD_WITH_CUDA=OFF (which ignores even a working driver). Every buffer is host, nothing is logged
// above debug level, and subscribers can still be registered. (The GPUDirect backend's side of the
// same cases is gtest/md/gpudirect_nodriver_test.cc.)
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "gtest/memtype/fake_driver.h"
#include "memtype/copier.h"
#include "memtype/memtype.h"

namespace gmd::memtype {
namespace {

void noop(void*, std::uintptr_t, std::size_t) {}

TEST(NoCudaTest, EveryBufferIsHostAndNothingIsLogged) {
  test::LogCapture log;
  auto& c = Classifier::instance();
  std::vector<char> heap(1 << 16);
  int stack = 0;
  for (const void* p : {static_cast<const void*>(heap.data()), static_cast<const void*>(&stack),
                        reinterpret_cast<const void*>(0x40000000ul),
                        reinterpret_cast<const void*>(std::uintptr_t{1} << 46)}) {
    const Info info = c.classify(p, 64);
    EXPECT_EQ(info.type, MemType::kHost);
    EXPECT_EQ(info.base, 0u);
    EXPECT_EQ(info.size, 0u);
    EXPECT_EQ(info.device, -1);
  }
  EXPECT_FALSE(c.cudaAvailable());
  EXPECT_EQ(c.deviceCount(), 0);
  EXPECT_FALSE(c.hooksInstalled());
  EXPECT_EQ(c.stats().lookups, 0u) << "the no-CUDA answer must not reach the CUDA path";
  EXPECT_EQ(log.loud(), 0);
}

TEST(NoCudaTest, SubscriptionsAndModesStillWork) {
  test::LogCapture log;
  auto& c = Classifier::instance();
  EXPECT_TRUE(c.subscribe(&noop, nullptr));
  c.setFreeMode(FreeMode::kValidate);
  EXPECT_EQ(c.freeMode(), FreeMode::kValidate);
  EXPECT_EQ(c.classify(&c, 1).type, MemType::kHost);
  c.notifyFree(0x1000, 0x1000);  // an external report still reaches subscribers
  EXPECT_EQ(c.stats().frees_seen, 1u);
  c.unsubscribe(&noop, nullptr);
  c.refreshHooks();
  c.flushCache();
  EXPECT_EQ(log.loud(), 0);
}

void noAlloc(void*, const AllocEvent&) {}

// No Copier, no SYNC_MEMOPS and no allocation events, quietly.
TEST(NoCudaTest, NoCopierNoSyncMemopsNoAllocationEvents) {
  test::LogCapture log;
  EXPECT_EQ(Copier::create(), nullptr);
  std::vector<char> buf(64);
  EXPECT_EQ(setSyncMemops(buf.data()), -1);
  EXPECT_FALSE(Classifier::instance().subscribeAllocations(&noAlloc, nullptr));
  Classifier::instance().unsubscribeAllocations(&noAlloc, nullptr);  // harmless
  EXPECT_FALSE(Classifier::instance().hooksInstalled());
  EXPECT_EQ(log.loud(), 0);
}

}  // namespace
}  // namespace gmd::memtype
