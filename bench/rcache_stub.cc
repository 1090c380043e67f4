// A registration cache that does nothing: get() hands out the region it was made with, put() and
// the rest do nothing. RcacheCallFloor (bench/rcache_bench.cc) takes its hits through the same
// calls as RcacheHit_gmd's, so the difference is what gmd's cache does on a hit. In a file of its
// own, so that the compiler cannot see which Cache the benchmark calls and skip the virtual calls.
#include <memory>

#include "rcache/rcache.h"

namespace gmd::bench {
namespace {

class StubCache final : public rcache::Cache {
 public:
  explicit StubCache(rcache::Region* region) noexcept : region_(region) {}
  Result get(const void*, std::size_t, unsigned, const rcache::Resolver&,
             rcache::Region** region) noexcept override {
    *region = region_;
    return Status::kOk;
  }
  bool find(const void*, std::size_t, unsigned, rcache::Region**) noexcept override {
    return false;
  }
  void put(rcache::Region*) noexcept override {}
  void invalidate(const void*, std::size_t) noexcept override {}
  void progress() noexcept override {}
  rcache::Stats stats() const noexcept override { return {}; }
  const rcache::Config& config() const noexcept override { return config_; }

 private:
  rcache::Region* region_;
  rcache::Config config_;
};

}  // namespace

std::unique_ptr<rcache::Cache> makeStubCache(rcache::Region* region) {
  return std::make_unique<StubCache>(region);
}

}  // namespace gmd::bench
