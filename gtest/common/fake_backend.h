// The one fake registration backend of the tests and benchmarks. With its oracle (the default) it
// keeps a record of what is registered, by whom, and how often it was deregistered, and fails the
// running test on a double or premature deregistration; failures can be injected. Without it
// (kNoOracle, for benchmarks) reg() and dereg() do nothing but succeed, so a benchmark measures the
// cache alone. Thread-safe (one mutex, oracle mode only).
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <ostream>
#include <unordered_set>
#include <vector>

#include "rcache/rcache.h"

namespace gmd {
// Lets gtest print a Status (and a Result) by name.
inline void PrintTo(Status s, std::ostream* os) { *os << statusString(s); }
inline void PrintTo(const Result& r, std::ostream* os) {
  *os << statusString(r.status);
  if (r.error != 0) *os << " (errno " << r.error << ")";
}
}  // namespace gmd

namespace gmd::test {

class FakeBackend final : public rcache::Backend {
 public:
  using Registration = rcache::Registration;
  using Region = rcache::Region;
  enum Oracle { kWithOracle, kNoOracle };
  explicit FakeBackend(Oracle oracle = kWithOracle, const char* name = "fake")
      : oracle_(oracle == kWithOracle), name_(name) {}
  explicit FakeBackend(const char* name) : FakeBackend(kWithOracle, name) {}

  struct Record {
    std::uintptr_t start = 0;
    std::size_t length = 0;
    unsigned access = 0;
    MemType type = MemType::kHost;
    std::uint64_t token = 0;      // from token_fn at registration time
    std::atomic<int> holders{0};  // maintained by the test: hold() / release()
    std::atomic<int> deregs{0};
  };

  Result reg(std::uintptr_t start, std::size_t length, unsigned access, MemoryKind memory,
             Registration* out) noexcept override {
    if (!oracle_) {
      out->lkey = out->rkey = 1;
      return Status::kOk;
    }
    std::function<void(std::uintptr_t, std::size_t)> hook;
    {
      std::lock_guard<std::mutex> g(mutex_);
      ++reg_calls_;
      if (!fail_next_.empty()) {
        const Status st = fail_next_.front();
        fail_next_.pop_front();
        if (st != Status::kOk) return st;
      }
      hook = on_reg_;
    }
    if (hook) hook(start, length);
    auto rec = std::make_unique<Record>();
    rec->start = start;
    rec->length = length;
    rec->access = access;
    rec->type = memory.type;
    if (token_fn_) rec->token = token_fn_(start);
    std::lock_guard<std::mutex> g(mutex_);
    out->handle = rec.get();
    out->lkey = static_cast<std::uint32_t>(records_.size() + 1);
    out->rkey = out->lkey + 0x1000;
    known_.insert(rec.get());
    records_.push_back(std::move(rec));
    ++live_;
    return Status::kOk;
  }

  void dereg(const Registration& reg) noexcept override {
    if (!oracle_) return;
    auto* rec = static_cast<Record*>(reg.handle);
    std::function<void(Record*)> hook;
    {
      std::lock_guard<std::mutex> g(mutex_);
      const bool known = known_.count(rec) != 0;
      EXPECT_TRUE(known) << "dereg of a handle never registered";
      if (!known) return;
      EXPECT_EQ(rec->deregs.load(), 0)
          << "double deregistration of [" << std::hex << rec->start << ", +" << rec->length << ")";
      EXPECT_EQ(rec->holders.load(), 0)
          << "deregistered while held: [" << std::hex << rec->start << ", +" << rec->length << ")";
      if (rec->holders.load() != 0) premature_.fetch_add(1);
      rec->deregs.fetch_add(1);
      --live_;
      ++dereg_calls_;
      if (inside_forbidden_ != nullptr && *inside_forbidden_) ++dereg_in_forbidden_;
      hook = on_dereg_;
    }
    if (hook) hook(rec);
  }

  const char* name() const noexcept override { return name_; }

  // Oracle bookkeeping done by the test around get()/put().
  static Record* record(const Region* r) { return static_cast<Record*>(r->registration().handle); }
  static void hold(const Region* r) { record(r)->holders.fetch_add(1); }
  static void release(const Region* r) { record(r)->holders.fetch_sub(1); }

  void failNext(Status st, int times = 1) {
    std::lock_guard<std::mutex> g(mutex_);
    for (int i = 0; i < times; ++i) fail_next_.push_back(st);
  }
  void onDereg(std::function<void(Record*)> f) {
    std::lock_guard<std::mutex> g(mutex_);
    on_dereg_ = std::move(f);
  }
  void onReg(std::function<void(std::uintptr_t, std::size_t)> f) {
    std::lock_guard<std::mutex> g(mutex_);
    on_reg_ = std::move(f);
  }
  void tokenFn(std::function<std::uint64_t(std::uintptr_t)> f) { token_fn_ = std::move(f); }
  // While *flag is true, any deregistration is counted in deregsInForbidden().
  void forbidDeregWhile(const bool* flag) { inside_forbidden_ = flag; }

  long live() const {
    std::lock_guard<std::mutex> g(mutex_);
    return live_;
  }
  long regCalls() const {
    std::lock_guard<std::mutex> g(mutex_);
    return reg_calls_;
  }
  long deregCalls() const {
    std::lock_guard<std::mutex> g(mutex_);
    return dereg_calls_;
  }
  // Successful registrations so far.
  long registered() const {
    std::lock_guard<std::mutex> g(mutex_);
    return static_cast<long>(records_.size());
  }
  // The oldest registration not deregistered yet (null when none).
  const Record* firstLive() const {
    std::lock_guard<std::mutex> g(mutex_);
    for (const auto& r : records_) {
      if (r->deregs.load() == 0) return r.get();
    }
    return nullptr;
  }
  long deregsInForbidden() const {
    std::lock_guard<std::mutex> g(mutex_);
    return dereg_in_forbidden_;
  }
  long premature() const { return premature_.load(); }
  // Every registration deregistered exactly once.
  void expectAllDeregisteredOnce() const {
    std::lock_guard<std::mutex> g(mutex_);
    for (const auto& r : records_) {
      EXPECT_EQ(r->deregs.load(), 1)
          << "registration [" << std::hex << r->start << ", +" << r->length << ") deregistered "
          << std::dec << r->deregs.load() << " times";
    }
  }

 private:
  const bool oracle_;
  const char* const name_;
  mutable std::mutex mutex_;
  std::vector<std::unique_ptr<Record>> records_;
  std::unordered_set<const Record*> known_;  // records_, for a constant-time lookup
  std::deque<Status> fail_next_;
  std::function<void(Record*)> on_dereg_;
  std::function<void(std::uintptr_t, std::size_t)> on_reg_;
  std::function<std::uint64_t(std::uintptr_t)> token_fn_;
  const bool* inside_forbidden_ = nullptr;
  long live_ = 0, reg_calls_ = 0, dereg_calls_ = 0, dereg_in_forbidden_ = 0;
  std::atomic<long> premature_{0};
};

}  // namespace gmd::test
