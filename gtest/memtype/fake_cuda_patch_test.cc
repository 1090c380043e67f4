// The fake CUDA driver's allocation and free entry points can be patched in place the way UCX's
// libucm patches a driver on x86-64 (fake_cuda.cc, "Entry points that UCX's libucm patches in
// place"): each starts with instructions an in-place patcher knows how to move, over at least the
// 12 bytes of a far jump, and once moved they still reach the fake's implementation.
//
// This binary links nothing of gmd's (no memtype hooks redirect the driver's symbols here), so
// dlsym answers the driver's own entry points. It patches them itself: the first whole instructions
// covering 12 bytes are copied into a trampoline followed by a jump back, and the entry is
// overwritten with "movabs $hook, %rax; jmp *%rax"; the hook counts the call and goes on through
// the trampoline.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace {

constexpr std::size_t kFarJump = 12;  // movabs $imm64, %rax; jmp *%rax
constexpr std::size_t kNearJump = 5;  // jmp rel32
constexpr std::size_t kMiB = 1 << 20;

// The entry points libucm's CUDA module patches (from UCX 1.15 to 1.22) that the fake defines.
const char* const kPatched[] = {
    "cuMemAlloc",        "cuMemAlloc_v2",   "cuMemAllocPitch", "cuMemAllocPitch_v2",
    "cuMemAllocManaged", "cuMemAllocAsync", "cuMemFree",       "cuMemFree_v2",
    "cuMemFreeAsync",    "cuMemMap",        "cuMemUnmap",
};

// The length of the instruction at p if it is one of the forms every libucm release from 1.15 on
// moves unchanged (push of a register, with or without REX.B; mov %rsp,%rbp; mov $imm32 into a
// 32-bit register; sub $imm32,%rsp), else 0. sub with an 8-bit immediate is left out: only UCX
// 1.18.1 and later move it.
std::size_t movable(const unsigned char* p) {
  if (p[0] >= 0x50 && p[0] <= 0x57) return 1;                  // push %r
  if (p[0] == 0x41 && p[1] >= 0x50 && p[1] <= 0x57) return 2;  // push %r8..%r15
  if (p[0] == 0x48 && p[1] == 0x89 && p[2] == 0xe5) return 3;  // mov %rsp,%rbp
  if (p[0] >= 0xb8 && p[0] <= 0xbf) return 5;                  // mov $imm32,%r32
  if (p[0] == 0x48 && p[1] == 0x81 && p[2] == 0xec) return 7;  // sub $imm32,%rsp
  return 0;
}

// How many bytes of whole movable instructions cover at least `need` bytes at p; 0 if an
// instruction before that is not movable.
std::size_t movablePrefix(const void* fn, std::size_t need) {
  const auto* p = static_cast<const unsigned char*>(fn);
  std::size_t n = 0;
  while (n < need) {
    const std::size_t len = movable(p + n);
    if (len == 0) return 0;
    n += len;
  }
  return n;
}

std::string hex(const void* fn, std::size_t n) {
  std::string s;
  char b[8];
  for (std::size_t i = 0; i < n; ++i) {
    std::snprintf(b, sizeof(b), " %02x", static_cast<const unsigned char*>(fn)[i]);
    s += b;
  }
  return s;
}

// One entry point patched in place to jump to a hook; restored on destruction.
class InPlacePatch {
 public:
  InPlacePatch(void* fn, void* hook) : fn_(static_cast<unsigned char*>(fn)) {
    prefix_ = movablePrefix(fn_, kFarJump);
    if (prefix_ == 0) return;
    page_ = sysconf(_SC_PAGESIZE);
    tramp_ = static_cast<unsigned char*>(mmap(nullptr, static_cast<std::size_t>(page_),
                                              PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                                              -1, 0));
    if (tramp_ == MAP_FAILED) {
      tramp_ = nullptr;
      return;
    }
    // The moved instructions, then jmp *0(%rip) with the address to go on at after them.
    std::memcpy(tramp_, fn_, prefix_);
    const unsigned char jmp_back[] = {0xff, 0x25, 0, 0, 0, 0};
    std::memcpy(tramp_ + prefix_, jmp_back, sizeof(jmp_back));
    const std::uintptr_t back = reinterpret_cast<std::uintptr_t>(fn_) + prefix_;
    std::memcpy(tramp_ + prefix_ + sizeof(jmp_back), &back, sizeof(back));
    if (mprotect(tramp_, static_cast<std::size_t>(page_), PROT_READ | PROT_EXEC) != 0) return;
    std::memcpy(saved_, fn_, kFarJump);
    unsigned char jump[kFarJump] = {0x48, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xe0};
    const auto target = reinterpret_cast<std::uintptr_t>(hook);
    std::memcpy(jump + 2, &target, sizeof(target));
    patched_ = store(jump);
  }
  ~InPlacePatch() {
    if (patched_) store(saved_);
    if (tramp_ != nullptr) munmap(tramp_, static_cast<std::size_t>(page_));
  }
  bool patched() const { return patched_; }
  std::size_t prefix() const { return prefix_; }
  void* original() const { return tramp_; }  // calls the entry point as it was

 private:
  bool store(const unsigned char* bytes) {
    const auto start =
        reinterpret_cast<std::uintptr_t>(fn_) & ~static_cast<std::uintptr_t>(page_ - 1);
    const std::size_t len = reinterpret_cast<std::uintptr_t>(fn_) + kFarJump - start;
    if (mprotect(reinterpret_cast<void*>(start), len, PROT_READ | PROT_WRITE | PROT_EXEC) != 0) {
      return false;
    }
    std::memcpy(fn_, bytes, kFarJump);
    __builtin___clear_cache(reinterpret_cast<char*>(fn_), reinterpret_cast<char*>(fn_ + kFarJump));
    return mprotect(reinterpret_cast<void*>(start), len, PROT_READ | PROT_EXEC) == 0;
  }

  unsigned char* fn_;
  unsigned char* tramp_ = nullptr;
  long page_ = 4096;
  std::size_t prefix_ = 0;
  unsigned char saved_[kFarJump] = {};
  bool patched_ = false;
};

using AllocFn = int (*)(std::uint64_t*, std::size_t);
using FreeFn = int (*)(std::uint64_t);

int g_alloc_calls = 0;
int g_free_calls = 0;
std::uint64_t g_last_freed = 0;
AllocFn g_orig_alloc = nullptr;
FreeFn g_orig_free = nullptr;

int hookAlloc(std::uint64_t* ptr, std::size_t size) {
  ++g_alloc_calls;
  return g_orig_alloc(ptr, size);
}
int hookFree(std::uint64_t ptr) {
  ++g_free_calls;
  g_last_freed = ptr;
  return g_orig_free(ptr);
}

class FakeCudaPatchTest : public ::testing::Test {
 protected:
  void SetUp() override {
#if !defined(__x86_64__)
    GTEST_SKIP() << "the fake's entry points are stubs for in-place patching on x86-64 only";
#endif
    driver_ = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(driver_, nullptr) << dlerror();
    ASSERT_NE(dlsym(driver_, "gmd_fake_cuda_driver"), nullptr)
        << "libcuda.so.1 is not the fake driver (the fake's folder must be first on "
           "LD_LIBRARY_PATH)";
    get_ = reinterpret_cast<long (*)(const char*)>(dlsym(driver_, "gmd_fake_cuda_get"));
    ASSERT_NE(get_, nullptr);
    auto init = reinterpret_cast<int (*)(unsigned)>(dlsym(driver_, "cuInit"));
    ASSERT_NE(init, nullptr);
    ASSERT_EQ(init(0), 0);
  }
  void* sym(const char* name) {
    void* fn = dlsym(driver_, name);
    EXPECT_NE(fn, nullptr) << name;
    return fn;
  }
  void* driver_ = nullptr;
  long (*get_)(const char*) = nullptr;
};

// Every patched entry point starts with movable instructions over a near and a far jump's bytes.
TEST_F(FakeCudaPatchTest, EntryPointsStartWithMovableInstructions) {
  for (const char* name : kPatched) {
    void* fn = sym(name);
    ASSERT_NE(fn, nullptr);
    EXPECT_NE(movablePrefix(fn, kNearJump), 0u) << name << ":" << hex(fn, 16);
    EXPECT_NE(movablePrefix(fn, kFarJump), 0u) << name << ":" << hex(fn, 16);
  }
}

// cuGetProcAddress hands out the same entry points as dlsym (a patch reaches both kinds of caller).
TEST_F(FakeCudaPatchTest, GetProcAddressHandsOutThePatchableEntryPoints) {
  using GetProc = int (*)(const char*, void**, int, std::uint64_t, int*);
  auto get_proc = reinterpret_cast<GetProc>(sym("cuGetProcAddress_v2"));
  ASSERT_NE(get_proc, nullptr);
  const struct {
    const char* base;
    const char* exported;
  } cases[] = {{"cuMemAlloc", "cuMemAlloc_v2"},
               {"cuMemFree", "cuMemFree_v2"},
               {"cuMemAllocPitch", "cuMemAllocPitch_v2"},
               {"cuMemAllocManaged", "cuMemAllocManaged"},
               {"cuMemAllocAsync", "cuMemAllocAsync"},
               {"cuMemFreeAsync", "cuMemFreeAsync"},
               {"cuMemMap", "cuMemMap"},
               {"cuMemUnmap", "cuMemUnmap"}};
  for (const auto& c : cases) {
    void* fn = nullptr;
    int status = -1;
    ASSERT_EQ(get_proc(c.base, &fn, 12000, 0, &status), 0) << c.base;
    EXPECT_EQ(fn, sym(c.exported)) << c.base;
  }
}

// Patched in place, cuMemAlloc_v2 and cuMemFree_v2 go through the hooks and, through the moved
// instructions, still allocate and free; restored, they no longer reach the hooks.
TEST_F(FakeCudaPatchTest, PatchedAllocAndFreeStillWork) {
  auto alloc = reinterpret_cast<AllocFn>(sym("cuMemAlloc_v2"));
  auto release = reinterpret_cast<FreeFn>(sym("cuMemFree_v2"));
  ASSERT_NE(alloc, nullptr);
  ASSERT_NE(release, nullptr);
  const long live = get_("live_allocations");
  {
    InPlacePatch pa(reinterpret_cast<void*>(alloc), reinterpret_cast<void*>(&hookAlloc));
    InPlacePatch pf(reinterpret_cast<void*>(release), reinterpret_cast<void*>(&hookFree));
    ASSERT_NE(pa.prefix(), 0u);
    if (!pa.patched() || !pf.patched()) {
      GTEST_SKIP() << "this process may not write to code pages (mprotect refused)";
    }
    g_orig_alloc = reinterpret_cast<AllocFn>(pa.original());
    g_orig_free = reinterpret_cast<FreeFn>(pf.original());
    g_alloc_calls = g_free_calls = 0;
    std::uint64_t p = 0;
    ASSERT_EQ(alloc(&p, kMiB), 0);
    EXPECT_NE(p, 0u);
    EXPECT_EQ(g_alloc_calls, 1);
    EXPECT_EQ(get_("live_allocations"), live + 1);
    ASSERT_EQ(release(p), 0);
    EXPECT_EQ(g_free_calls, 1);
    EXPECT_EQ(g_last_freed, p);
    EXPECT_EQ(get_("live_allocations"), live);
    // An invalid free still fails, through the hook.
    EXPECT_NE(release(p), 0);
    EXPECT_EQ(g_free_calls, 2);
  }
  g_alloc_calls = g_free_calls = 0;
  std::uint64_t q = 0;
  ASSERT_EQ(alloc(&q, kMiB), 0);
  ASSERT_EQ(release(q), 0);
  EXPECT_EQ(g_alloc_calls, 0);
  EXPECT_EQ(g_free_calls, 0);
  EXPECT_EQ(get_("live_allocations"), live);
}

}  // namespace
