// The miss path of Cache::get(): a classifying Resolver is asked once per miss and never on a hit,
// what it resolves reaches the backend, its failures and the backend's errno reach the caller; and
// invalidations reaching the top of the address space.
#include <gtest/gtest.h>

#include <cerrno>
#include <cstdint>
#include <memory>

#include "gtest/common/fake_backend.h"
#include "rcache/rcache.h"

namespace gmd::rcache::test {

using gmd::test::FakeBackend;
namespace {

// A backend that fails with an errno, as a verbs backend does.
class ErrnoBackend final : public Backend {
 public:
  Result reg(std::uintptr_t, std::size_t, unsigned, MemoryKind, Registration*) noexcept override {
    ++calls;
    return Result::fromErrno(err);
  }
  void dereg(const Registration&) noexcept override {}
  const char* name() const noexcept override { return "errno"; }
  int err = EFAULT;
  int calls = 0;
};

struct Classifier {
  Backend* backend = nullptr;
  MemoryKind memory{MemType::kHost};
  Result result{};
  int calls = 0;
  static Resolution resolve(void* ctx, const void*, std::size_t) noexcept {
    auto* c = static_cast<Classifier*>(ctx);
    ++c->calls;
    return Resolution{c->result, c->memory, c->backend};
  }
  Resolver resolver() { return Resolver(&Classifier::resolve, this); }
};

class ResolverTest : public ::testing::Test {
 protected:
  static constexpr std::uintptr_t kPage = 4096;
  // Fake addresses, never dereferenced.
  static void* at(std::uintptr_t page) {
    return reinterpret_cast<void*>((3ull << 32) + page * kPage);
  }

  void SetUp() override { ASSERT_EQ(Cache::create(Config{}, &cache_), Status::kOk); }
  FakeBackend be_;
  std::unique_ptr<Cache> cache_;
};

TEST_F(ResolverTest, AskedOncePerMissNeverOnAHit) {
  Classifier c;
  c.backend = &be_;
  c.memory = MemoryKind(MemType::kCuda, 3);
  Region* a = nullptr;
  ASSERT_EQ(cache_->get(at(0), 2 * kPage, kAccessLocalRead, c.resolver(), &a), Status::kOk);
  EXPECT_EQ(c.calls, 1);
  EXPECT_EQ(a->memType(), MemType::kCuda);
  EXPECT_EQ(a->backend(), &be_);
  Region* b = nullptr;
  ASSERT_EQ(cache_->get(at(1), kPage, kAccessLocalRead, c.resolver(), &b), Status::kOk);
  EXPECT_EQ(a, b);
  EXPECT_EQ(c.calls, 1) << "a hit needs no classification";
  cache_->put(a);
  cache_->put(b);
  Region* d = nullptr;
  ASSERT_EQ(cache_->get(at(5), kPage, kAccessLocalRead, c.resolver(), &d), Status::kOk);
  EXPECT_EQ(c.calls, 2);
  cache_->put(d);
  EXPECT_EQ(be_.regCalls(), 2);
}

TEST_F(ResolverTest, TheResolvedKindReachesTheBackend) {
  Classifier c;
  c.backend = &be_;
  c.memory = MemoryKind(MemType::kCudaManaged, 1);
  Region* r = nullptr;
  ASSERT_EQ(cache_->get(at(0), kPage, kAccessLocalRead, c.resolver(), &r), Status::kOk);
  EXPECT_EQ(FakeBackend::record(r)->type, MemType::kCudaManaged);
  cache_->put(r);
}

TEST_F(ResolverTest, AClassifyingHitMatchesAnyKindAFixedOneOnlyItsOwn) {
  Region* host = nullptr;
  ASSERT_EQ(cache_->get(at(0), kPage, kAccessLocalRead, MemType::kHost, &be_, &host), Status::kOk);
  FakeBackend other;
  Classifier c;
  c.backend = &other;
  Region* r = nullptr;
  ASSERT_EQ(cache_->get(at(0), kPage, kAccessLocalRead, c.resolver(), &r), Status::kOk);
  EXPECT_EQ(r, host) << "whatever backend registered it, the region covers the request";
  EXPECT_EQ(c.calls, 0);
  cache_->put(r);
  ASSERT_EQ(cache_->get(at(0), kPage, kAccessLocalRead, MemType::kHost, &other, &r), Status::kOk);
  EXPECT_NE(r, host) << "a fixed resolver hits only regions of its own backend";
  cache_->put(r);
  cache_->put(host);
  cache_.reset();  // before `other` goes
  be_.expectAllDeregisteredOnce();
  other.expectAllDeregisteredOnce();
}

TEST_F(ResolverTest, AResolverFailureIsReturnedAndRegistersNothing) {
  Classifier c;
  c.backend = &be_;
  c.result = Status::kUnsupported;
  Region* r = nullptr;
  EXPECT_EQ(cache_->get(at(0), kPage, kAccessLocalRead, c.resolver(), &r), Status::kUnsupported);
  EXPECT_EQ(r, nullptr);
  c.result = Status::kOk;
  c.backend = nullptr;
  EXPECT_EQ(cache_->get(at(0), kPage, kAccessLocalRead, c.resolver(), &r), Status::kInvalidParam)
      << "no backend named";
  EXPECT_EQ(be_.regCalls(), 0);
  EXPECT_EQ(cache_->stats().regions, 0u);
}

TEST_F(ResolverTest, BadRequestsFailBeforeTheResolverIsAsked) {
  Classifier c;
  c.backend = &be_;
  Region* r = nullptr;
  EXPECT_EQ(cache_->get(at(0), 0, kAccessLocalRead, c.resolver(), &r), Status::kInvalidParam);
  EXPECT_EQ(cache_->get(at(0), kPage, 1u << 20, c.resolver(), &r), Status::kInvalidParam);
  EXPECT_EQ(c.calls, 0);
}

TEST_F(ResolverTest, TheBackendsErrnoTravelsInTheResult) {
  ErrnoBackend eb;
  Region* r = nullptr;
  Result res = cache_->get(at(0), kPage, kAccessLocalRead, MemType::kHost, &eb, &r);
  EXPECT_EQ(res.status, Status::kIoError);
  EXPECT_EQ(res.error, EFAULT);
  EXPECT_EQ(eb.calls, 1);
  eb.err = ENOMEM;  // a resource shortage: evict, retry once, then fail with the last errno
  res = cache_->get(at(0), kPage, kAccessLocalRead, MemType::kHost, &eb, &r);
  EXPECT_EQ(res.status, Status::kNoResource);
  EXPECT_EQ(res.error, ENOMEM);
  EXPECT_EQ(eb.calls, 3);
  // A success after a failure carries no stale errno.
  res = cache_->get(at(0), kPage, kAccessLocalRead, MemType::kHost, &be_, &r);
  ASSERT_TRUE(res.ok());
  EXPECT_EQ(res.error, 0);
  cache_->put(r);
}

// An invalidation whose last byte is the first byte of the topmost page of the address space (its
// aligned end would be 2^64) must still invalidate what it covers. The former arithmetic in
// invalidate() turned that range into [start, 0), an empty range, so the regions stayed valid.
TEST_F(ResolverTest, InvalidationUpToTheTopOfTheAddressSpaceInvalidates) {
  const std::uintptr_t top_block = UINTPTR_MAX - (kPage - 1);
  const std::uintptr_t last = top_block - kPage;  // the highest page a region may cover
  Region* r = nullptr;
  ASSERT_EQ(
      cache_->get(reinterpret_cast<void*>(last), kPage, kAccessLocalRead, MemType::kHost, &be_, &r),
      Status::kOk);
  FakeBackend::hold(r);
  Region* s = nullptr;
  ASSERT_EQ(cache_->get(at(0), kPage, kAccessLocalRead, MemType::kHost, &be_, &s), Status::kOk);
  FakeBackend::hold(s);
  // [at(0), top_block + 1): the range ends in the first byte of the topmost block.
  cache_->invalidate(at(0), top_block - reinterpret_cast<std::uintptr_t>(at(0)) + 1);
  FakeBackend::release(r);
  cache_->put(r);
  FakeBackend::release(s);
  cache_->put(s);
  cache_->progress();
  EXPECT_EQ(be_.live(), 0) << "both regions were invalidated and released";
  EXPECT_EQ(cache_->stats().invalidations_in_use, 2u);
  // And one reaching the very last byte (it wraps when aligned) invalidates from its start up.
  ASSERT_EQ(
      cache_->get(reinterpret_cast<void*>(last), kPage, kAccessLocalRead, MemType::kHost, &be_, &r),
      Status::kOk);
  cache_->put(r);
  cache_->invalidate(reinterpret_cast<void*>(last), UINTPTR_MAX - last + 1);
  cache_->progress();
  EXPECT_EQ(be_.live(), 0);
  be_.expectAllDeregisteredOnce();
}

}  // namespace
}  // namespace gmd::rcache::test
