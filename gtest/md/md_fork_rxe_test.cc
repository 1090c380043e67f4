// fork() with gmd loaded, the way UCX processes meet it: UCX's own IB MD is open beside gmd's on the
// same device, and its default UCX_IB_FORK_INIT=try calls ibv_fork_init(); RDMAV_FORK_SAFE=1 does the
// same without it. From then on libibverbs marks every registered page do-not-fork (MADV_DONTFORK):
// a page that is still registered at fork() is absent in the child.
//
// Each protection mode needs a fresh process (ibv_fork_init() cannot be undone, RDMAV_FORK_SAFE is
// read when libibverbs starts), so the MdFork.* cases run this binary again with the mode in
// GMD_MD_FORK_MODE, where the MdForkInMode.* cases are registered and run:
//   ib-md   UCX's ib MD opened with its default UCX_IB_FORK_INIT=try
//   env     RDMAV_FORK_SAFE=1, no ib MD
//   off     UCX_IB_FORK_INIT=n and no RDMAV_FORK_SAFE, ib MD opened
// The forked children check with plain code and report through their exit status.
#include <gtest/gtest.h>
#include <infiniband/verbs.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <uct/api/uct.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gtest/rxe/uct_fixture.h"
#include "gtest/rxe/verbs_fixture.h"
#include "md/mapping.h"
#include "md/md.h"

extern char** environ;

namespace gmd::test {
namespace {

const std::size_t kPage = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
constexpr unsigned kRma = UCT_MD_MEM_ACCESS_RMA;
constexpr const char* kModeVar = "GMD_MD_FORK_MODE";

const bool kPluginLoaded = loadGmdPluginFirst();

const char* mode() { return std::getenv(kModeVar); }

// "exit N", "signal N (name)" or "no exit within the limit" for a child, which is killed then.
std::string waitChild(pid_t pid, int seconds = 120) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  int status = 0;
  for (;;) {
    const pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) break;
    if (r < 0) return std::string("waitpid: ") + std::strerror(errno);
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return "no exit within the limit";
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (WIFEXITED(status)) return "exit " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return "signal " + std::to_string(WTERMSIG(status)) + " (" + strsignal(WTERMSIG(status)) + ")";
  }
  return "status " + std::to_string(status);
}

// A byte sum of [p, p + n), volatile so that every byte is really read.
std::uint64_t sum(const void* p, std::size_t n) {
  const volatile std::uint8_t* b = static_cast<const volatile std::uint8_t*>(p);
  std::uint64_t s = 0;
  for (std::size_t i = 0; i < n; ++i) s = s * 31 + b[i];
  return s;
}

std::uintptr_t pageDown(const void* p) { return reinterpret_cast<std::uintptr_t>(p) & ~(kPage - 1); }
std::uintptr_t pageUp(const void* p) {
  return (reinterpret_cast<std::uintptr_t>(p) + kPage - 1) & ~(kPage - 1);
}

// ---------------------------------------------------------------------------------------------------
// The cases, run in a process started in one mode.

class MdForkInMode : public ::testing::Test {
 protected:
  void SetUp() override {
    GMD_REQUIRE_RDMA_DEVICES(2);
    ASSERT_NE(nullptr, mode()) << "these cases run in the processes MdFork.* starts";
    const std::string m = mode();
    std::vector<std::string> gmd_names;
    comp_ = findComponent("gmd", &gmd_names);
    ASSERT_NE(nullptr, comp_) << "component gmd is not listed";
    ASSERT_GE(gmd_names.size(), 2u);
    names_ = gmd_names;
    std::vector<std::string> ib_names;
    uct_component_h ib = m != "env" ? findComponent("ib", &ib_names) : nullptr;
    if (m == "ib-md" && ib == nullptr) {
      GTEST_SKIP() << "this UCX has no ib component (built without verbs transports)";
    }
    if (ib != nullptr) {
      // UCX's ib MD beside gmd's, as in every UCX process that loads gmd (where UCX has one).
      ASSERT_FALSE(ib_names.empty());
      ucs_status_t st;
      ib_md_ = openMd(ib, ib_names[0], &st);
      ASSERT_EQ(UCS_OK, st) << "ib MD " << ib_names[0] << ": " << ucs_status_string(st);
    }
    ucs_status_t st;
    md_ = openMd(comp_, names_[0], &st);
    ASSERT_EQ(UCS_OK, st) << ucs_status_string(st);
    const ibv_fork_status fs = ibv_is_fork_initialized();
    if (m == "off") {
      EXPECT_NE(IBV_FORK_ENABLED, fs) << "fork protection is on in mode off";
    } else {
      // On a kernel with copy-on-fork for pinned pages libibverbs may report it unneeded; the
      // cases must pass either way, but the mode is meant to turn MADV_DONTFORK on.
      EXPECT_NE(IBV_FORK_DISABLED, fs) << "fork protection did not turn on in mode " << m;
    }
    protected_ = fs == IBV_FORK_ENABLED;
  }
  void TearDown() override {
    if (md_ != nullptr) uct_md_close(md_);
    if (ib_md_ != nullptr) uct_md_close(ib_md_);
  }
  uct_mem_h reg(uct_md_h md, void* addr, std::size_t len) {
    uct_mem_h memh = nullptr;
    const ucs_status_t st = uct_md_mem_reg(md, addr, len, kRma, &memh);
    EXPECT_EQ(UCS_OK, st) << ucs_status_string(st);
    return st == UCS_OK ? memh : nullptr;
  }
  rcache::Stats stats() { return md::Md::from(md_)->registrar().cache().stats(); }

  uct_component_h comp_ = nullptr;
  std::vector<std::string> names_;
  uct_md_h ib_md_ = nullptr;
  uct_md_h md_ = nullptr;
  bool protected_ = false;
};

// UCX's test_md_fork as an application meets it: a heap buffer registered and released (cached by
// gmd), then fork; the child reads the buffer and the heap that shares its first and last pages.
void childReadsHeapNextToAReleasedRegistration(uct_md_h md) {
  constexpr std::size_t kLen = 64 * 1024;
  for (int round = 0; round < 3; ++round) {
    auto* buf = static_cast<std::uint8_t*>(std::malloc(kLen));
    ASSERT_NE(nullptr, buf);
    std::memset(buf, 0x5a + round, kLen);
    uct_mem_h memh = nullptr;
    ASSERT_EQ(UCS_OK, uct_md_mem_reg(md, buf, kLen, kRma, &memh));
    ASSERT_EQ(UCS_OK, uct_md_mem_dereg(md, memh));
    // The pages the registration covered, the heap around the buffer included. The neighbours
    // may change at fork (the fork handlers free memory), so the child only reads them; the buffer
    // itself must hold what the parent wrote.
    const auto* lo = reinterpret_cast<const std::uint8_t*>(pageDown(buf));
    const std::size_t span = pageUp(buf + kLen) - pageDown(buf);
    const std::uint8_t want = static_cast<std::uint8_t>(0x5a + round);
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      (void)sum(lo, span);  // faults if a page of the span is missing
      for (std::size_t i = 0; i < kLen; ++i) {
        if (buf[i] != want) _exit(3);
      }
      _exit(0);
    }
    EXPECT_EQ("exit 0", waitChild(pid)) << "round " << round << ": the child lost heap memory";
    std::free(buf);
  }
}

class ChildReadsHeapNextToAReleasedRegistration : public MdForkInMode {
  void TestBody() override;
};
void ChildReadsHeapNextToAReleasedRegistration::TestBody() {
  childReadsHeapNextToAReleasedRegistration(md_);
  // Nothing unused stays registered across fork.
  EXPECT_EQ(0u, stats().unused_bytes);
}

// The child opens its own gmd MD (the parent's device context is not the child's) and registers
// its own buffer, while the parent holds one registration and has released another.
class ChildRegistersItsOwnBuffer : public MdForkInMode {
  void TestBody() override;
};
void ChildRegistersItsOwnBuffer::TestBody() {
  constexpr std::size_t kLen = 64 * 1024;
  // What the parent holds registered is absent in a protected child, and so would be any heap that
  // shared its pages: applications hold long-lived registrations on mappings of their own.
  Mapping held(kLen);
  ASSERT_NE(nullptr, held.addr);
  std::vector<std::uint8_t> released(kLen);
  uct_mem_h mh = reg(md_, held.addr, kLen);
  uct_mem_h mr = reg(md_, released.data(), kLen);
  ASSERT_TRUE(mh && mr);
  ASSERT_EQ(UCS_OK, uct_md_mem_dereg(md_, mr));
  const std::string dev = names_[0];
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ucs_status_t st;
    uct_md_h md = openMd(comp_, dev, &st);
    if (md == nullptr) _exit(10);
    auto* mine = static_cast<std::uint8_t*>(std::malloc(kLen));
    if (mine == nullptr) _exit(11);
    std::memset(mine, 1, kLen);
    uct_mem_h m = nullptr;
    if (uct_md_mem_reg(md, mine, kLen, kRma, &m) != UCS_OK) _exit(12);
    std::uint8_t packed[md::kPackedRkeySize];
    if (uct_md_mkey_pack(md, m, packed) != UCS_OK) _exit(13);
    if (uct_md_mem_dereg(md, m) != UCS_OK) _exit(14);
    // The buffer released in the parent is heap the child owns too.
    if (sum(released.data(), kLen) != 0) _exit(15);
    uct_md_close(md);
    _exit(0);
  }
  EXPECT_EQ("exit 0", waitChild(pid)) << "codes: see the child in the test";
  ASSERT_EQ(UCS_OK, uct_md_mem_dereg(md_, mh));
}

// The parent goes on after the fork: a registration it held across it still works for RDMA, one it
// had released is registered again and works too.
class ParentKeepsWorkingAfterFork : public MdForkInMode {
  void TestBody() override;
};
void ParentKeepsWorkingAfterFork::TestBody() {
  ucs_status_t st;
  uct_md_h initiator = openMd(comp_, names_[1], &st);
  ASSERT_EQ(UCS_OK, st) << ucs_status_string(st);
  std::string err;
  RcPair pair;
  {
    auto pi = VerbsPort::wrap(md::Md::from(initiator)->context(), md::Md::from(initiator)->pd(),
                              names_[1], &err);
    ASSERT_TRUE(pi) << err;
    auto pt = VerbsPort::wrap(md::Md::from(md_)->context(), md::Md::from(md_)->pd(), names_[0], &err);
    ASSERT_TRUE(pt) << err;
    ASSERT_TRUE(pair.connect(std::move(pi), std::move(pt), &err)) << err;
  }
  constexpr std::size_t kLen = 256 * 1024;
  Mapping src(kLen), held(kLen), again(kLen);
  ASSERT_TRUE(src.addr && held.addr && again.addr);
  uct_mem_h ms = reg(initiator, src.addr, kLen);
  uct_mem_h mh = reg(md_, held.addr, kLen);
  uct_mem_h ma = reg(md_, again.addr, kLen);
  ASSERT_TRUE(ms && mh && ma);
  ASSERT_EQ(UCS_OK, uct_md_mem_dereg(md_, ma));
  const auto* held_region = static_cast<const rcache::Region*>(mh);

  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) _exit(0);
  ASSERT_EQ("exit 0", waitChild(pid));

  // The held registration is the same one and still valid for RDMA.
  uct_mem_h mh2 = reg(md_, held.addr, kLen);
  ASSERT_NE(nullptr, mh2);
  EXPECT_EQ(held_region, static_cast<const rcache::Region*>(mh2));
  // The released one is registered anew.
  uct_mem_h ma2 = reg(md_, again.addr, kLen);
  ASSERT_NE(nullptr, ma2);
  const auto* lreg = static_cast<const rcache::Region*>(ms);
  for (uct_mem_h target : {mh2, ma2}) {
    const auto* r = static_cast<const rcache::Region*>(target);
    std::uint8_t* dst = target == mh2 ? held.addr : again.addr;
    fillPattern(src.addr, kLen, reinterpret_cast<std::uintptr_t>(dst));
    std::memset(dst, 0, kLen);
    ASSERT_EQ(IBV_WC_SUCCESS,
              pair.qa->write(src.addr, kLen, lreg->registration().lkey,
                             reinterpret_cast<std::uintptr_t>(dst), r->registration().rkey, &err))
        << err;
    EXPECT_EQ(kLen, checkPattern(dst, kLen, reinterpret_cast<std::uintptr_t>(dst)));
  }
  for (uct_mem_h m : {mh2, ma2, mh}) ASSERT_EQ(UCS_OK, uct_md_mem_dereg(md_, m));
  ASSERT_EQ(UCS_OK, uct_md_mem_dereg(initiator, ms));
  pair = RcPair{};
  uct_md_close(initiator);
  // And the heap next to a released registration is still the child's after this fork too.
  childReadsHeapNextToAReleasedRegistration(md_);
}

// ---------------------------------------------------------------------------------------------------
// The driver: this binary again, in each mode.

struct ModeCase {
  const char* name;
  std::vector<std::string> set;  // NAME=value added to the environment
};

void runInMode(const ModeCase& m) {
  if (std::string(m.name) == "ib-md" && findComponent("ib") == nullptr) {
    GTEST_SKIP() << "this UCX has no ib component (built without verbs transports, as Debian's "
                    "UCX 1.23): no ib MD to open beside gmd's";
  }
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string kv = *e;
    if (kv.rfind("RDMAV_FORK_SAFE=", 0) == 0 || kv.rfind("IBV_FORK_SAFE=", 0) == 0 ||
        kv.rfind("UCX_IB_FORK_INIT=", 0) == 0 || kv.rfind(std::string(kModeVar) + "=", 0) == 0) {
      continue;
    }
    env.push_back(kv);
  }
  env.push_back(std::string(kModeVar) + "=" + m.name);
  for (const auto& s : m.set) env.push_back(s);
  std::vector<char*> envp;
  for (auto& s : env) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::string self = "/proc/self/exe";
  std::string filter = "--gtest_filter=MdForkInMode.*";
  std::vector<char*> argv = {self.data(), filter.data(), nullptr};
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  ASSERT_GT(n, 0);
  exe[n] = '\0';
  pid_t pid;
  ASSERT_EQ(0, posix_spawn(&pid, exe, nullptr, nullptr, argv.data(), envp.data()));
  EXPECT_EQ("exit 0", waitChild(pid, 600)) << "mode " << m.name << " (its output is above)";
}

TEST(MdFork, WithUcxIbMdForkInit) { runInMode({"ib-md", {}}); }
TEST(MdFork, WithRdmavForkSafe) { runInMode({"env", {"RDMAV_FORK_SAFE=1"}}); }
TEST(MdFork, WithoutForkProtection) { runInMode({"off", {"UCX_IB_FORK_INIT=n"}}); }

// The MdForkInMode cases exist only in a process started by runInMode() (registered here, before
// main(), when the mode is set), so that a plain run shows only MdFork.*.
template <typename Case>
void registerInMode(const char* name, int line) {
  ::testing::RegisterTest("MdForkInMode", name, nullptr, nullptr, __FILE__, line,
                          []() -> MdForkInMode* { return new Case; });
}
struct RegisterInMode {
  RegisterInMode() {
    if (mode() == nullptr) return;
    registerInMode<ChildReadsHeapNextToAReleasedRegistration>(
        "ChildReadsHeapNextToAReleasedRegistration", __LINE__);
    registerInMode<ChildRegistersItsOwnBuffer>("ChildRegistersItsOwnBuffer", __LINE__);
    registerInMode<ParentKeepsWorkingAfterFork>("ParentKeepsWorkingAfterFork", __LINE__);
  }
} const kRegisterInMode;

}  // namespace
}  // namespace gmd::test
