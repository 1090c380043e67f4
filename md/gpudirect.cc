#include "md/gpudirect.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/log.h"
#include "common/range.h"
#include "md/mapping.h"
#include "memtype/copier.h"
#include "memtype/cuda_driver.h"
#include "memtype/memtype.h"

#ifndef GMD_HAVE_IBV_DMABUF
#define GMD_HAVE_IBV_DMABUF 0
#endif

namespace gmd::md {

const char* kDmabufPolicyNames[] = {"try", "on", "off", nullptr};
static_assert(static_cast<unsigned>(DmabufPolicy::kTry) == 0 &&
                  static_cast<unsigned>(DmabufPolicy::kOn) == 1 &&
                  static_cast<unsigned>(DmabufPolicy::kOff) == 2,
              "DmabufPolicy values index kDmabufPolicyNames");

const char* gpuDirectMethodName(GpuDirectMethod m) noexcept {
  switch (m) {
    case GpuDirectMethod::kUnknown:
      return "unknown";
    case GpuDirectMethod::kDmabuf:
      return "dma-buf";
    case GpuDirectMethod::kPeerMem:
      return "peer-memory";
    case GpuDirectMethod::kUnsupported:
      return "unsupported";
  }
  return "unknown";
}

// --- SystemGpuDirectOps
// ---------------------------------------------------------------------------

ibv_mr* SystemGpuDirectOps::regMr(ibv_pd* pd, void* addr, std::size_t length, int access) noexcept {
  return systemVerbsOps().regMr(pd, addr, length, access);
}

ibv_mr* SystemGpuDirectOps::regDmabufMr(ibv_pd* pd, std::uint64_t offset, std::size_t length,
                                        std::uint64_t iova, int fd, int access) noexcept {
#if GMD_HAVE_IBV_DMABUF
  return ibv_reg_dmabuf_mr(pd, offset, length, iova, fd, access);
#else
  (void)pd, (void)offset, (void)length, (void)iova, (void)fd, (void)access;
  errno = EOPNOTSUPP;
  return nullptr;
#endif
}

int SystemGpuDirectOps::deregMr(ibv_mr* mr) noexcept { return systemVerbsOps().deregMr(mr); }

bool SystemGpuDirectOps::pathExists(const char* path) noexcept { return access(path, F_OK) == 0; }

bool SystemGpuDirectOps::verbsHasDmabuf() noexcept { return GMD_HAVE_IBV_DMABUF != 0; }

bool SystemGpuDirectOps::deviceHasDmabuf(int device) noexcept {
  const memtype::detail::DriverApi* api = memtype::detail::driver();
  if (api == nullptr || api->memGetHandleForAddressRange == nullptr) return false;
  int value = 0;
  constexpr int kAttrDmabufSupported = 124;  // CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED
  return api->deviceGetAttribute(&value, kAttrDmabufSupported, device) == 0 && value != 0;
}

int SystemGpuDirectOps::exportDmabuf(std::uintptr_t start, std::size_t length, bool pcie,
                                     int* fd) noexcept {
  const memtype::detail::DriverApi* api = memtype::detail::driver();
  constexpr int kNotSupported = 801;       // CUDA_ERROR_NOT_SUPPORTED
  constexpr int kHandleTypeDmabuf = 1;     // CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD
  constexpr unsigned long long kPcie = 1;  // CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE
  if (api == nullptr || api->memGetHandleForAddressRange == nullptr) return kNotSupported;
  int out = -1;
  const int r =
      api->memGetHandleForAddressRange(&out, start, length, kHandleTypeDmabuf, pcie ? kPcie : 0);
  if (r == 0) *fd = out;
  return r;
}

void SystemGpuDirectOps::closeFd(int fd) noexcept { close(fd); }

std::int64_t SystemGpuDirectOps::dmabufSize(int fd) noexcept {
  return static_cast<std::int64_t>(lseek(fd, 0, SEEK_END));
}

namespace {
thread_local const DmabufOffer* t_offer = nullptr;
}  // namespace

DmabufOffer::DmabufOffer(int fd, std::uintptr_t address, std::size_t offset) noexcept
    : fd_(fd), base_(address - offset), outer_(t_offer) {
  t_offer = this;
}

DmabufOffer::~DmabufOffer() { t_offer = outer_; }

const DmabufOffer* DmabufOffer::current() noexcept { return t_offer; }

int SystemGpuDirectOps::setSyncMemops(std::uintptr_t ptr) noexcept {
  return memtype::setSyncMemops(reinterpret_cast<const void*>(ptr));
}

// --- GpuDirectBackend
// -----------------------------------------------------------------------------

namespace {

constexpr const char* kModule = "md";

bool isResource(Status s) noexcept { return s == Status::kNoResource; }

std::uintptr_t pageSize() noexcept {
  static const auto ps = static_cast<std::uintptr_t>(sysconf(_SC_PAGESIZE));
  return ps;
}

}  // namespace

GpuDirectBackend::GpuDirectBackend(ibv_pd* pd, const GpuDirectConfig& config,
                                   GpuDirectOps* ops) noexcept
    : pd_(pd), config_(config), ops_(ops != nullptr ? ops : &system_ops_) {
  for (auto& m : methods_) m.store(GpuDirectMethod::kUnknown, std::memory_order_relaxed);
  for (auto& p : pcie_flag_) p.store(-1, std::memory_order_relaxed);
}

bool GpuDirectBackend::peerMemLoaded() noexcept {
  int v = peermem_.load(std::memory_order_acquire);
  if (v < 0) {
    v = ops_->pathExists("/sys/module/nvidia_peermem") ||
                ops_->pathExists("/sys/kernel/mm/memory_peers/nv_mem") ||
                ops_->pathExists("/sys/module/nv_peer_mem")
            ? 1
            : 0;
    peermem_.store(v, std::memory_order_release);
  }
  return v != 0;
}

bool GpuDirectBackend::nicImportsDmabuf() noexcept {
  int v = nic_dmabuf_.load(std::memory_order_acquire);
  if (v >= 0) return v != 0;
  if (!ops_->verbsHasDmabuf()) {
    v = 0;
  } else {
    // The registration cannot succeed with fd -1: how far it gets tells whether the provider and
    // the kernel driver import dma-bufs at all (UCX's IB MD asks the same way).
    errno = 0;
    ibv_mr* mr = ops_->regDmabufMr(pd_, 0, pageSize(), 0, -1, toVerbsAccess(rcache::kAccessAll));
    const int err = errno;
    if (mr != nullptr) {
      ops_->deregMr(mr);
      v = 1;
    } else {
      v = err == EBADF ? 1 : 0;
    }
    log(LogLevel::kDebug, kModule, "ibv_reg_dmabuf_mr(fd=-1): %s: the NIC %s dma-buf",
        mr != nullptr ? "registered" : std::strerror(err), v != 0 ? "imports" : "does not import");
  }
  int expected = -1;
  if (!nic_dmabuf_.compare_exchange_strong(expected, v, std::memory_order_acq_rel)) v = expected;
  return v != 0;
}

bool GpuDirectBackend::takesDmabuf() noexcept {
  // Only a dma-buf registration uses the caller's fd: some GPU must have that method (which asks
  // the NIC only where a GPU could use the answer).
  const int n = memtype::Classifier::instance().deviceCount();
  for (int d = 0; d < n && d < kMaxDevices; ++d) {
    if (method(d) == GpuDirectMethod::kDmabuf) return true;
  }
  return false;
}

GpuDirectMethod GpuDirectBackend::probe(int device) noexcept {
  if (device < 0 || device >= kMaxDevices || !memtype::Classifier::instance().cudaAvailable()) {
    return GpuDirectMethod::kUnsupported;
  }
  // The GPU's attribute first: a NIC is probed only when some GPU could use what it answers.
  const bool gpu_dmabuf = config_.dmabuf != DmabufPolicy::kOff && ops_->verbsHasDmabuf() &&
                          ops_->deviceHasDmabuf(device);
  const bool dmabuf = gpu_dmabuf && nicImportsDmabuf();
  const bool peermem = config_.dmabuf != DmabufPolicy::kOn && peerMemLoaded();
  const GpuDirectMethod m = dmabuf    ? GpuDirectMethod::kDmabuf
                            : peermem ? GpuDirectMethod::kPeerMem
                                      : GpuDirectMethod::kUnsupported;
  log(LogLevel::kDebug, kModule, "GPUDirect on CUDA device %d: %s (dma-buf policy %s%s%s%s)",
      device, gpuDirectMethodName(m), kDmabufPolicyNames[static_cast<unsigned>(config_.dmabuf)],
      ops_->verbsHasDmabuf() ? "" : ", libibverbs without dma-buf",
      gpu_dmabuf && !dmabuf ? ", the NIC imports no dma-buf" : "",
      peermem ? ", peer memory loaded" : "");
  return m;
}

GpuDirectMethod GpuDirectBackend::method(int device) noexcept {
  if (device < 0 || device >= kMaxDevices) return GpuDirectMethod::kUnsupported;
  GpuDirectMethod m = methods_[device].load(std::memory_order_acquire);
  if (m == GpuDirectMethod::kUnknown) {
    GpuDirectMethod expected = GpuDirectMethod::kUnknown;
    m = probe(device);
    if (!methods_[device].compare_exchange_strong(expected, m, std::memory_order_acq_rel)) {
      m = expected;  // another thread probed (or demoted) first
    }
  }
  return m;
}

bool GpuDirectBackend::cudaSupported() noexcept {
  const int n = memtype::Classifier::instance().deviceCount();
  if (n <= 0) return false;
  for (int d = 0; d < n && d < kMaxDevices; ++d) {
    if (method(d) == GpuDirectMethod::kUnsupported) return false;
  }
  return true;
}

// UCX warns and registers anyway (1.13 cuda_md.c mem_query, 1.18 cuda_copy_md.c): the attribute
// orders the application's own copies before the NIC's access, and its absence is a hazard only
// for applications that race their cuMemcpy with the transfer. Refusing would turn that into a hard
// failure of every registration where the driver cannot set it (CUDA VMM allocations before
// cuCtxSetFlags, old drivers), so gmd does the same: log, count, go on.
void GpuDirectBackend::syncMemops(std::uintptr_t start) noexcept {
  const int r = ops_->setSyncMemops(start);
  if (r == 0) return;
  sync_memops_failures_.fetch_add(1, std::memory_order_relaxed);
  if (r < 0) {
    log(LogLevel::kDebug, kModule,
        "the CUDA driver cannot set SYNC_MEMOPS (no cuPointerSetAttribute) on %#lx",
        static_cast<unsigned long>(start));
  } else if (!sync_memops_warned_.exchange(true, std::memory_order_relaxed)) {
    log(LogLevel::kWarn, kModule,
        "cuPointerSetAttribute(%#lx, SYNC_MEMOPS) failed (%d): registering without it (warned "
        "once)",
        static_cast<unsigned long>(start), r);
  } else {
    log(LogLevel::kDebug, kModule, "cuPointerSetAttribute(%#lx, SYNC_MEMOPS) failed (%d)",
        static_cast<unsigned long>(start), r);
  }
}

// ibv_reg_mr on the device pointer (peer memory). Failures carry their errno; the registrar logs.
Result GpuDirectBackend::regPeerMem(std::uintptr_t start, std::size_t length, int access,
                                    ibv_mr** mr) noexcept {
  errno = 0;
  ibv_mr* m = ops_->regMr(pd_, reinterpret_cast<void*>(start), length, access);
  if (m == nullptr) return Result::fromErrno(errno != 0 ? errno : EIO);
  *mr = m;
  return Status::kOk;
}

// The caller's dma-buf, where it covers [start, start + length): registered at the range's offset
// in it, and left open. kUnsupported (nothing logged above debug) sends the caller to an export of
// its own.
Result GpuDirectBackend::regOffered(const DmabufOffer& offer, std::uintptr_t start,
                                    std::size_t length, int access, ibv_mr** mr) noexcept {
  const std::int64_t size = ops_->dmabufSize(offer.fd());
  if (start < offer.base() || size < 0 ||
      start - offer.base() + length > static_cast<std::uint64_t>(size)) {
    log(LogLevel::kDebug, kModule,
        "the caller's dma-buf (fd %d, %#lx+%lld) does not cover %#lx+%zu: exporting one",
        offer.fd(), static_cast<unsigned long>(offer.base()), static_cast<long long>(size),
        static_cast<unsigned long>(start), length);
    return Status::kUnsupported;
  }
  errno = 0;
  ibv_mr* m = ops_->regDmabufMr(pd_, start - offer.base(), length, start, offer.fd(), access);
  if (m != nullptr) {
    dmabuf_offered_.fetch_add(1, std::memory_order_relaxed);
    *mr = m;
    return Status::kOk;
  }
  const int err = errno != 0 ? errno : EIO;
  log(LogLevel::kDebug, kModule, "ibv_reg_dmabuf_mr on the caller's dma-buf (fd %d) failed: %s",
      offer.fd(), std::strerror(err));
  if (statusFromErrno(err) == Status::kNoResource) return Result(Status::kNoResource, err);
  return Status::kUnsupported;
}

Result GpuDirectBackend::regDmabuf(std::uintptr_t start, std::size_t length, int access, int device,
                                   ibv_mr** mr) noexcept {
  if (const DmabufOffer* offer = DmabufOffer::current(); offer != nullptr) {
    const Result r = regOffered(*offer, start, length, access, mr);
    if (r == Status::kOk || isResource(r)) return r;
  }
  Range pages;
  if (!alignOutwards(start, length, pageSize(), &pages)) return Status::kInvalidParam;
  const std::uintptr_t aligned = pages.start;
  const std::size_t aligned_len = pages.length();
  int last_err = 0;
  int cu_err = 0;
  // The PCIe mapping flag first unless this device already rejected it, then a plain export.
  bool tries[2];
  int n = 0;
  if (pcie_flag_[device].load(std::memory_order_relaxed) != 0) tries[n++] = true;
  tries[n++] = false;
  for (int i = 0; i < n; ++i) {
    const bool pcie = tries[i];
    int fd = -1;
    cu_err = ops_->exportDmabuf(aligned, aligned_len, pcie, &fd);
    if (cu_err != 0) {
      if (pcie) pcie_flag_[device].store(0, std::memory_order_relaxed);
      continue;
    }
    errno = 0;
    ibv_mr* m = ops_->regDmabufMr(pd_, start - aligned, length, start, fd, access);
    last_err = errno != 0 ? errno : EIO;
    ops_->closeFd(fd);  // the MR holds its own reference to the dma-buf
    if (m != nullptr) {
      if (pcie) pcie_flag_[device].store(1, std::memory_order_relaxed);
      *mr = m;
      return Status::kOk;
    }
    if (statusFromErrno(last_err) == Status::kNoResource)
      return Result(Status::kNoResource, last_err);
    if (pcie) pcie_flag_[device].store(0, std::memory_order_relaxed);
  }
  if (last_err == 0) {
    log(LogLevel::kDebug, kModule, "cuMemGetHandleForAddressRange(%#lx, %zu) failed (%d)",
        static_cast<unsigned long>(aligned), aligned_len, cu_err);
    return Status::kUnsupported;
  }
  log(LogLevel::kDebug, kModule, "ibv_reg_dmabuf_mr(%#lx, %zu) failed: %s",
      static_cast<unsigned long>(start), length, std::strerror(last_err));
  const Status s = statusFromErrno(last_err);
  return Result(s == Status::kUnsupported ? s : Status::kIoError, last_err);
}

Result GpuDirectBackend::regDevice(std::uintptr_t start, std::size_t length, int access, int device,
                                   rcache::Registration* out) noexcept {
  ibv_mr* mr = nullptr;
  GpuDirectMethod m = method(device);
  if (m != GpuDirectMethod::kUnsupported) syncMemops(start);
  if (m == GpuDirectMethod::kDmabuf) {
    const Result s = regDmabuf(start, length, access, device, &mr);
    if (s == Status::kOk) {
      dmabuf_regs_.fetch_add(1, std::memory_order_relaxed);
    } else if (isResource(s)) {
      return s;
    } else if (config_.dmabuf == DmabufPolicy::kTry && peerMemLoaded()) {
      GpuDirectMethod expected = GpuDirectMethod::kDmabuf;
      if (methods_[device].compare_exchange_strong(expected, GpuDirectMethod::kPeerMem)) {
        demotions_.fetch_add(1, std::memory_order_relaxed);
        log(LogLevel::kInfo, kModule,
            "dma-buf registration failed on CUDA device %d (%s): using peer memory", device,
            statusString(s.status));
      }
      m = GpuDirectMethod::kPeerMem;
    } else {
      // The registrar reports the failure (with its errno), once.
      log(LogLevel::kDebug, kModule,
          "dma-buf registration of %#lx+%zu on CUDA device %d failed: %s",
          static_cast<unsigned long>(start), length, device, statusString(s.status));
      return s;
    }
  }
  if (m == GpuDirectMethod::kPeerMem) {
    const Result s = regPeerMem(start, length, access, &mr);
    if (!s.ok()) return s;
    peermem_regs_.fetch_add(1, std::memory_order_relaxed);
  }
  if (mr == nullptr) {
    unsupported_.fetch_add(1, std::memory_order_relaxed);
    log(LogLevel::kDebug, kModule, "no GPUDirect method on CUDA device %d", device);
    return Status::kUnsupported;
  }
  out->handle = mr;
  out->lkey = mr->lkey;
  out->rkey = mr->rkey;
  return Status::kOk;
}

Result GpuDirectBackend::reg(std::uintptr_t start, std::size_t length, unsigned access,
                             MemoryKind memory, rcache::Registration* out) noexcept {
  if (length == 0 || out == nullptr || start + length < start ||
      (access & ~static_cast<unsigned>(rcache::kAccessAll)) != 0) {
    return Status::kInvalidParam;
  }
  int device = memory.device;
  if (memory.type == MemType::kCuda && device < 0) {
    const memtype::Info info =
        memtype::Classifier::instance().classify(reinterpret_cast<const void*>(start), length);
    device = info.type == MemType::kCuda ? std::max(info.device, 0) : -1;
  }
  if (memory.type != MemType::kCuda || device < 0) {
    // Host pages are VerbsBackend's; managed memory is the registrar's policy decision.
    unsupported_.fetch_add(1, std::memory_order_relaxed);
    log(LogLevel::kDebug, kModule, "%#lx+%zu (%s) is not CUDA device memory here",
        static_cast<unsigned long>(start), length, memTypeName(memory.type));
    return Status::kUnsupported;
  }
  return regDevice(start, length, toVerbsAccess(access), device, out);
}

void GpuDirectBackend::dereg(const rcache::Registration& reg) noexcept {
  auto* mr = static_cast<ibv_mr*>(reg.handle);
  if (mr == nullptr) return;
  const int err = ops_->deregMr(mr);
  if (err != 0) {
    log(LogLevel::kError, kModule, "ibv_dereg_mr failed: %s", std::strerror(err));
  }
}

GpuDirectStats GpuDirectBackend::stats() const noexcept {
  GpuDirectStats s;
  s.dmabuf_regs = dmabuf_regs_.load(std::memory_order_relaxed);
  s.dmabuf_offered = dmabuf_offered_.load(std::memory_order_relaxed);
  s.peermem_regs = peermem_regs_.load(std::memory_order_relaxed);
  s.unsupported = unsupported_.load(std::memory_order_relaxed);
  s.dmabuf_demotions = demotions_.load(std::memory_order_relaxed);
  s.sync_memops_failures = sync_memops_failures_.load(std::memory_order_relaxed);
  return s;
}

}  // namespace gmd::md
