// The cache's writer lock (rcache/sync.h) beside two others: one round trip (lock, a counter
// bumped, unlock) on one thread, the lock always free, as a miss or an eviction takes it (two or
// three times each).
//
//   Lock_gmd            WriterLock: a compare-and-swap to take it, a store and a load to free it
//   Lock_exchange       the same freed with an atomic exchange, which tells the unlocker whether
//                       anyone sleeps (the writer lock before it was freed with a store)
//   Lock_pthread_spin   pthread_spin_lock (what UCX's ucs_spinlock wraps): an atomic decrement to
//                       take it, a store to free it
// (No std::mutex: glibc's takes no atomic at all while the process has one thread.)
#include <benchmark/benchmark.h>
#include <pthread.h>

#include <atomic>
#include <cstdint>

#include "rcache/sync.h"

namespace {

template <typename Lock>
void roundTrips(benchmark::State& state, Lock& lock) {
  long counter = 0;
  for (auto _ : state) {
    lock.lock();
    ++counter;
    benchmark::DoNotOptimize(counter);
    lock.unlock();
  }
}

void Lock_gmd(benchmark::State& state) {
  gmd::rcache::detail::WriterLock lock;
  roundTrips(state, lock);
}
BENCHMARK(Lock_gmd);

// Only ever free here: no waiting path.
class ExchangeLock {
 public:
  void lock() {
    std::uint32_t expected = 0;
    while (!state_.compare_exchange_strong(expected, 1, std::memory_order_acquire)) expected = 0;
  }
  void unlock() {
    if (state_.exchange(0, std::memory_order_release) == 2) state_.notify_one();
  }

 private:
  std::atomic<std::uint32_t> state_{0};
};
void Lock_exchange(benchmark::State& state) {
  ExchangeLock lock;
  roundTrips(state, lock);
}
BENCHMARK(Lock_exchange);

class SpinLock {
 public:
  SpinLock() { pthread_spin_init(&s_, PTHREAD_PROCESS_PRIVATE); }
  ~SpinLock() { pthread_spin_destroy(&s_); }
  void lock() { pthread_spin_lock(&s_); }
  void unlock() { pthread_spin_unlock(&s_); }

 private:
  pthread_spinlock_t s_;
};
void Lock_pthread_spin(benchmark::State& state) {
  SpinLock lock;
  roundTrips(state, lock);
}
BENCHMARK(Lock_pthread_spin);

}  // namespace
