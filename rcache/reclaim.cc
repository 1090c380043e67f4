// Thread indices, reader slots, the asymmetric fence and epoch-based collection.
#include "rcache/reclaim.h"

#include <linux/membarrier.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <mutex>
#include <new>
#include <vector>

namespace gmd::rcache::detail {
namespace {

// ---------------------------------------------------------------------------------------------------
// Thread indices (dense, reused after thread exit)

struct ThreadIndexRegistry {
  std::mutex mutex;
  std::vector<int> free_list;
  int next = 0;
};

// Never destroyed (threads may exit after main()), and in static storage: the fork handlers lock
// and unlock its mutex, and the child may lack a heap page that shares a registered buffer's page.
alignas(ThreadIndexRegistry) unsigned char g_thread_registry_storage[sizeof(ThreadIndexRegistry)];
ThreadIndexRegistry& threadRegistry() {
  static ThreadIndexRegistry* r = new (g_thread_registry_storage) ThreadIndexRegistry;
  return *r;
}

__attribute__((tls_model("initial-exec"))) thread_local int tls_thread_index = -1;
__attribute__((tls_model("initial-exec"))) thread_local bool tls_thread_exiting = false;

struct ThreadIndexReleaser {
  ~ThreadIndexReleaser() {
    // A cache call from a later thread-local destructor takes the slow path (no slot).
    tls_thread_exiting = true;
    if (tls_thread_index < 0) return;
    ThreadIndexRegistry& r = threadRegistry();
    std::lock_guard<std::mutex> g(r.mutex);
    try {
      r.free_list.push_back(tls_thread_index);
    } catch (...) {
      // The index leaks; harmless.
    }
    tls_thread_index = -1;
  }
};

int threadIndexSlow() noexcept {
  if (tls_thread_exiting) return -1;
  static thread_local ThreadIndexReleaser releaser;
  (void)&releaser;
  ThreadIndexRegistry& r = threadRegistry();
  std::lock_guard<std::mutex> g(r.mutex);
  int idx;
  if (!r.free_list.empty()) {
    idx = r.free_list.back();
    r.free_list.pop_back();
  } else if (r.next < kMaxThreads) {
    idx = r.next++;
  } else {
    return -1;
  }
  tls_thread_index = idx;
  return idx;
}

// ---------------------------------------------------------------------------------------------------
// Asymmetric fence for the reader epochs
//
// A reader must publish its epoch before it loads the index (a store-load order, which needs a full
// fence on x86). With membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) the reader only needs a compiler
// barrier: the writer runs membarrier() before it scans the reader slots, which makes every running
// thread of the process execute a full fence, so either the writer sees the reader's epoch or the
// reader sees the new index. Without membarrier (old kernels) and under ThreadSanitizer (which does
// not model it) readers use a sequentially consistent store instead.

bool registerMembarrier() noexcept {
#if defined(__SANITIZE_THREAD__)
  return false;
#else
  const long cmds = syscall(SYS_membarrier, MEMBARRIER_CMD_QUERY, 0);
  if (cmds < 0 || (cmds & MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0) return false;
  return syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0) == 0;
#endif
}

}  // namespace

int threadIndex() noexcept {
  const int i = tls_thread_index;
  return __builtin_expect(i >= 0, 1) ? i : threadIndexSlow();
}

void lockThreadRegistry() noexcept { threadRegistry().mutex.lock(); }
void unlockThreadRegistry() noexcept { threadRegistry().mutex.unlock(); }

const bool g_asymmetric_fence = registerMembarrier();

// Without membarrier, the readers' sequentially consistent stores and the writer's sequentially
// consistent loads of the slots already order things; nothing more to do.
void writerFence() noexcept {
  if (g_asymmetric_fence) syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0);
}

// ---------------------------------------------------------------------------------------------------
// Reader slots

// Slot chunks live on pages of their own (mmap), like the cache: the fork child handler writes
// them, and a heap page may be do-not-fork when it shares a page with a registered buffer.
ReaderSlots::SlotChunk* ReaderSlots::allocateChunk() noexcept {
  void* p = ::mmap(nullptr, sizeof(SlotChunk), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                   -1, 0);
  return p == MAP_FAILED ? nullptr : new (p) SlotChunk;
}

void ReaderSlots::releaseChunk(SlotChunk* c) noexcept {
  if (c == nullptr) return;
  c->~SlotChunk();
  ::munmap(c, sizeof(SlotChunk));
}

ReaderSlots::~ReaderSlots() {
  for (auto& c : chunks_) releaseChunk(c.load(std::memory_order_relaxed));
}

ReaderSlot* ReaderSlots::slot(int index) noexcept {
  const auto ci = static_cast<std::size_t>(index) / kSlotsPerChunk;
  SlotChunk* c = chunks_[ci].load(std::memory_order_acquire);
  if (__builtin_expect(c == nullptr, 0)) {
    SlotChunk* fresh = allocateChunk();
    if (fresh == nullptr) return nullptr;
    if (chunks_[ci].compare_exchange_strong(c, fresh, std::memory_order_seq_cst)) {
      c = fresh;
    } else {
      releaseChunk(fresh);
    }
  }
  // Published before the thread first uses the slot, so that writers scan it.
  const auto want = static_cast<std::size_t>(index) + 1;
  std::size_t lim = slot_limit_.load(std::memory_order_relaxed);
  while (lim < want && !slot_limit_.compare_exchange_weak(lim, want, std::memory_order_seq_cst)) {
  }
  return &c->slot[static_cast<std::size_t>(index) % kSlotsPerChunk];
}

std::uint64_t ReaderSlots::oldestReader() const noexcept {
  writerFence();
  std::uint64_t min_active = UINT64_MAX;
  forEach([&](const ReaderSlot& s) {
    const std::uint64_t e = s.epoch.load(std::memory_order_seq_cst);
    if (e != 0 && e < min_active) min_active = e;
  });
  return min_active;
}

// ---------------------------------------------------------------------------------------------------
// Retired objects

Reclaimed RetireList::collect(ReaderSlots& slots, bool force) noexcept {
  Reclaimed freeable;
  if ((head_ == nullptr && records_ == nullptr) ||
      (!force && count_ < kCollectBatch && bytes_ < kCollectBytes)) {
    return freeable;
  }
  if (retired_since_advance_) {
    slots.advance();
    retired_since_advance_ = false;
  }
  const std::uint64_t min_active = slots.oldestReader();
  for (Retired** link = &head_; *link != nullptr;) {
    Retired* x = *link;
    if (x->retire_epoch < min_active) {
      --count_;
      bytes_ -= x->bytes;
      *link = x->next_retired;
      x->next_retired = freeable.objects;
      freeable.objects = x;
    } else {
      link = &x->next_retired;
    }
  }
  for (RetiredRecord** link = &records_; *link != nullptr;) {
    RetiredRecord* x = *link;
    if (x->epoch < min_active) {
      --count_;
      *link = x->next;
      x->next = freeable.records;
      freeable.records = x;
    } else {
      link = &x->next;
    }
  }
  return freeable;
}

}  // namespace gmd::rcache::detail
