// The cache's writer lock (rcache/sync.h) on its own. unlock() is a store and a load, not an atomic
// exchange, so it can miss a waiter that is just going to sleep (that sleep then ends by its
// timeout); a waiter must still get the lock, whether the holder keeps it for a few instructions
// (the spin), longer than a time slice (the futex), or keeps taking it again and again (the waiter
// is not shut out for good).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "rcache/sync.h"

namespace gmd::rcache::detail {
namespace {

TEST(WriterLockTest, TryLockFailsWhileHeldByAnyoneTheOwnerIncluded) {
  WriterLock lock;
  ASSERT_TRUE(lock.try_lock());
  EXPECT_FALSE(lock.try_lock());  // the owner: fails, does not deadlock
  bool other = true;
  std::thread([&] { other = lock.try_lock(); }).join();
  EXPECT_FALSE(other);
  lock.unlock();
  std::thread([&] { other = lock.try_lock(); }).join();
  EXPECT_TRUE(other);  // released by the store alone
  lock.unlock();       // from another thread than the one that took it: the word only
  EXPECT_TRUE(lock.try_lock());
  lock.unlock();
}

// Four threads, each taking the lock 100,000 times and bumping plain counters inside: no increment
// is lost and no two threads are ever inside together.
TEST(WriterLockTest, ExcludesUnderContention) {
  WriterLock lock;
  constexpr int kThreads = 4;
  constexpr int kRounds = 100000;
  long counter = 0;  // plain: only the holder touches it
  std::atomic<int> inside{0};
  std::atomic<int> overlaps{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int k = 0; k < kRounds; ++k) {
        WriterGuard g(lock);
        if (inside.fetch_add(1, std::memory_order_relaxed) != 0) overlaps.fetch_add(1);
        ++counter;
        inside.fetch_sub(1, std::memory_order_relaxed);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(counter, static_cast<long>(kThreads) * kRounds);
  EXPECT_EQ(overlaps.load(), 0);
}

// A holder that keeps the lock for 50 ms: the waiter is past its spin, asleep on the futex, when
// the lock is freed. It must not get in before the release, and must get in after it (bounded: a
// lost wake-up without the timeout would hang here).
TEST(WriterLockTest, ASleepingWaiterGetsTheLockAfterALongHold) {
  WriterLock lock;
  lock.lock();
  std::atomic<bool> released{false};
  std::atomic<bool> entered_early{false};
  std::atomic<bool> entered{false};
  std::thread waiter([&] {
    lock.lock();
    if (!released.load()) entered_early = true;
    entered = true;
    lock.unlock();
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(entered.load());
  released = true;
  lock.unlock();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!entered.load() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_TRUE(entered.load()) << "the waiter never took the freed lock";
  waiter.join();
  EXPECT_FALSE(entered_early.load());
}

// A thread that takes the lock back at once, over and over (a writer doing miss after miss), leaves
// it free between its turns: a waiter that sleeps meanwhile still gets in.
TEST(WriterLockTest, AWaiterGetsInBetweenAnotherThreadsBackToBackHolds) {
  WriterLock lock;
  std::atomic<bool> stop{false};
  std::atomic<long> turns{0};
  std::thread busy([&] {
    while (!stop.load(std::memory_order_relaxed)) {
      WriterGuard g(lock);
      // A writer's stretch: a few microseconds inside.
      const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(5);
      while (std::chrono::steady_clock::now() < until) {
      }
      turns.fetch_add(1, std::memory_order_relaxed);
    }
  });
  while (turns.load() < 100) std::this_thread::yield();
  std::atomic<int> got{0};
  std::thread waiter([&] {
    for (int k = 0; k < 20; ++k) {
      WriterGuard g(lock);
      got.fetch_add(1);
    }
  });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (got.load() < 20 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const int got_then = got.load();
  stop = true;
  busy.join();
  waiter.join();
  EXPECT_EQ(got_then, 20) << "the waiter was shut out by back-to-back holds";
}

// fork() while a thread sleeps on the lock: the child, alone, frees it with unlockInForkChild(),
// which forgets the waiter the parent counted (it does not exist in the child; a count left of it
// would make each of the child's unlocks a futex system call).
TEST(WriterLockTest, AForkChildForgetsTheParentsWaiters) {
  WriterLock lock;
  lock.lock();
  std::thread waiter([&] {
    lock.lock();
    lock.unlock();
  });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (lock.waitersForTests() == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const std::uint32_t counted = lock.waitersForTests();
  const pid_t pid = counted == 1 ? fork() : -1;
  if (pid == -1) {  // the waiter is let go and joined: a failed test must not abort the binary
    lock.unlock();
    waiter.join();
    EXPECT_EQ(counted, 1u) << "the waiter never went to sleep on the lock";
    if (counted == 1) ADD_FAILURE() << "fork() failed";
    return;
  }
  if (pid == 0) {
    lock.unlockInForkChild();
    const bool ok = lock.waitersForTests() == 0 && lock.try_lock();
    _exit(ok ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  lock.unlock();  // the parent's waiter goes on
  waiter.join();
  EXPECT_EQ(lock.waitersForTests(), 0u);
}

}  // namespace
}  // namespace gmd::rcache::detail
