#include "memtype/gpudirect.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "memtype/cuda_driver.h"

#ifndef GMD_HAVE_IBV_DMABUF
#define GMD_HAVE_IBV_DMABUF 0
#endif

namespace gmd::memtype {

using rcache::Status;

const char* dmabufPolicyName(DmabufPolicy p) noexcept {
  switch (p) {
    case DmabufPolicy::kTry: return "try";
    case DmabufPolicy::kOn: return "on";
    case DmabufPolicy::kOff: return "off";
  }
  return "unknown";
}

bool parseDmabufPolicy(const char* text, DmabufPolicy* out) noexcept {
  if (text == nullptr) return false;
  for (DmabufPolicy p : {DmabufPolicy::kTry, DmabufPolicy::kOn, DmabufPolicy::kOff}) {
    if (std::strcmp(text, dmabufPolicyName(p)) == 0) {
      *out = p;
      return true;
    }
  }
  return false;
}

const char* gpuDirectMethodName(GpuDirectMethod m) noexcept {
  switch (m) {
    case GpuDirectMethod::kUnknown: return "unknown";
    case GpuDirectMethod::kDmabuf: return "dma-buf";
    case GpuDirectMethod::kPeerMem: return "peer-memory";
    case GpuDirectMethod::kUnsupported: return "unsupported";
  }
  return "unknown";
}

// --- SystemGpuDirectOps ---------------------------------------------------------------------------

ibv_mr* SystemGpuDirectOps::regMr(ibv_pd* pd, void* addr, std::size_t length, int access) noexcept {
  return ibv_reg_mr(pd, addr, length, access);
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

int SystemGpuDirectOps::deregMr(ibv_mr* mr) noexcept { return ibv_dereg_mr(mr); }

bool SystemGpuDirectOps::pathExists(const char* path) noexcept { return access(path, F_OK) == 0; }

bool SystemGpuDirectOps::verbsHasDmabuf() noexcept { return GMD_HAVE_IBV_DMABUF != 0; }

bool SystemGpuDirectOps::deviceHasDmabuf(int device) noexcept {
  const detail::DriverApi* api = detail::driver();
  if (api == nullptr || api->memGetHandleForAddressRange == nullptr) return false;
  int value = 0;
  constexpr int kAttrDmabufSupported = 124;  // CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED
  return api->deviceGetAttribute(&value, kAttrDmabufSupported, device) == 0 && value != 0;
}

int SystemGpuDirectOps::exportDmabuf(std::uintptr_t start, std::size_t length, bool pcie,
                                     int* fd) noexcept {
  const detail::DriverApi* api = detail::driver();
  constexpr int kNotSupported = 801;     // CUDA_ERROR_NOT_SUPPORTED
  constexpr int kHandleTypeDmabuf = 1;   // CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD
  constexpr unsigned long long kPcie = 1;  // CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE
  if (api == nullptr || api->memGetHandleForAddressRange == nullptr) return kNotSupported;
  int out = -1;
  const int r = api->memGetHandleForAddressRange(&out, start, length, kHandleTypeDmabuf,
                                                 pcie ? kPcie : 0);
  if (r == 0) *fd = out;
  return r;
}

void SystemGpuDirectOps::closeFd(int fd) noexcept { close(fd); }

// --- GpuDirectBackend -----------------------------------------------------------------------------

namespace {

int verbsAccess(unsigned access) noexcept {
  int a = 0;
  if (access & rcache::kAccessLocalWrite) a |= IBV_ACCESS_LOCAL_WRITE;
  if (access & rcache::kAccessRemoteRead) a |= IBV_ACCESS_REMOTE_READ;
  // Verbs requires local write with remote write or atomics.
  if (access & rcache::kAccessRemoteWrite) a |= IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE;
  if (access & rcache::kAccessRemoteAtomic) a |= IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_LOCAL_WRITE;
  return a;
}

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

GpuDirectMethod GpuDirectBackend::probe(int device) noexcept {
  if (device < 0 || device >= kMaxDevices || !Classifier::instance().cudaAvailable()) {
    return GpuDirectMethod::kUnsupported;
  }
  const bool dmabuf = config_.dmabuf != DmabufPolicy::kOff && ops_->verbsHasDmabuf() &&
                      ops_->deviceHasDmabuf(device);
  const bool peermem = config_.dmabuf != DmabufPolicy::kOn && peerMemLoaded();
  const GpuDirectMethod m = dmabuf    ? GpuDirectMethod::kDmabuf
                            : peermem ? GpuDirectMethod::kPeerMem
                                      : GpuDirectMethod::kUnsupported;
  log(LogLevel::kDebug, detail::kLogModule,
      "GPUDirect on CUDA device %d: %s (dma-buf policy %s%s%s)", device, gpuDirectMethodName(m),
      dmabufPolicyName(config_.dmabuf),
      ops_->verbsHasDmabuf() ? "" : ", libibverbs without dma-buf",
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
  const int n = Classifier::instance().deviceCount();
  if (n <= 0) return false;
  for (int d = 0; d < n && d < kMaxDevices; ++d) {
    if (method(d) == GpuDirectMethod::kUnsupported) return false;
  }
  return true;
}

bool GpuDirectBackend::managedSupported() noexcept {
  return config_.managed == ManagedPolicy::kHostPages && Classifier::instance().cudaAvailable();
}

Result GpuDirectBackend::regPlain(std::uintptr_t start, std::size_t length, int access,
                                  ibv_mr** mr) noexcept {
  errno = 0;
  ibv_mr* m = ops_->regMr(pd_, reinterpret_cast<void*>(start), length, access);
  if (m == nullptr) {
    const int err = errno != 0 ? errno : EIO;
    const Result s = Result::fromErrno(err);
    log(isResource(s) ? LogLevel::kDebug : LogLevel::kError, detail::kLogModule,
        "ibv_reg_mr(%#lx, %zu) failed: %s", static_cast<unsigned long>(start), length,
        std::strerror(err));
    return s;
  }
  *mr = m;
  return Status::kOk;
}

Result GpuDirectBackend::regDmabuf(std::uintptr_t start, std::size_t length, int access, int device,
                                   ibv_mr** mr) noexcept {
  const std::uintptr_t ps = pageSize();
  const std::uintptr_t aligned = start & ~(ps - 1);
  const std::size_t aligned_len = ((start + length + ps - 1) & ~(ps - 1)) - aligned;
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
    log(LogLevel::kDebug, detail::kLogModule,
        "cuMemGetHandleForAddressRange(%#lx, %zu) failed (%d)", static_cast<unsigned long>(aligned),
        aligned_len, cu_err);
    return Status::kUnsupported;
  }
  log(LogLevel::kDebug, detail::kLogModule, "ibv_reg_dmabuf_mr(%#lx, %zu) failed: %s",
      static_cast<unsigned long>(start), length, std::strerror(last_err));
  const Status s = statusFromErrno(last_err);
  return Result(s == Status::kUnsupported ? s : Status::kIoError, last_err);
}

Result GpuDirectBackend::regDevice(std::uintptr_t start, std::size_t length, int access, int device,
                                   rcache::Registration* out) noexcept {
  ibv_mr* mr = nullptr;
  GpuDirectMethod m = method(device);
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
        log(LogLevel::kInfo, detail::kLogModule,
            "dma-buf registration failed on CUDA device %d (%s): using peer memory", device,
            rcache::statusString(s));
      }
      m = GpuDirectMethod::kPeerMem;
    } else {
      log(LogLevel::kError, detail::kLogModule,
          "dma-buf registration of %#lx+%zu on CUDA device %d failed: %s",
          static_cast<unsigned long>(start), length, device, rcache::statusString(s));
      return s;
    }
  }
  if (m == GpuDirectMethod::kPeerMem) {
    const Result s = regPlain(start, length, access, &mr);
    if (!s.ok()) return s;
    peermem_regs_.fetch_add(1, std::memory_order_relaxed);
  }
  if (mr == nullptr) {
    unsupported_.fetch_add(1, std::memory_order_relaxed);
    log(LogLevel::kDebug, detail::kLogModule, "no GPUDirect method on CUDA device %d", device);
    return Status::kUnsupported;
  }
  out->handle = mr;
  out->lkey = mr->lkey;
  out->rkey = mr->rkey;
  return Status::kOk;
}

Result GpuDirectBackend::reg(std::uintptr_t start, std::size_t length, unsigned access,
                             MemoryKind memory, rcache::Registration* out) noexcept {
  const MemType type = memory.type;
  if (length == 0 || out == nullptr || start + length < start || (access & ~rcache::kAccessAll)) {
    return Status::kInvalidParam;
  }
  const int vaccess = verbsAccess(access);
  switch (type) {
    case MemType::kCudaManaged:
      if (config_.managed != ManagedPolicy::kHostPages) {
        unsupported_.fetch_add(1, std::memory_order_relaxed);
        log(LogLevel::kDebug, detail::kLogModule,
            "managed memory %#lx+%zu not registered (policy refuse)",
            static_cast<unsigned long>(start), length);
        return Status::kUnsupported;
      }
      [[fallthrough]];  // kHostPages: registered as the host pages it is backed by
    case MemType::kHost: {
      ibv_mr* mr = nullptr;
      const Result s = regPlain(start, length, vaccess, &mr);
      if (!s.ok()) return s;
      host_regs_.fetch_add(1, std::memory_order_relaxed);
      out->handle = mr;
      out->lkey = mr->lkey;
      out->rkey = mr->rkey;
      return Status::kOk;
    }
    case MemType::kCuda: {
      if (memory.device >= 0) return regDevice(start, length, vaccess, memory.device, out);
      const Info info = Classifier::instance().classify(reinterpret_cast<const void*>(start), length);
      if (info.type != MemType::kCuda) {
        unsupported_.fetch_add(1, std::memory_order_relaxed);
        log(LogLevel::kDebug, detail::kLogModule, "%#lx is not CUDA device memory here",
            static_cast<unsigned long>(start));
        return Status::kUnsupported;
      }
      return regDevice(start, length, vaccess, info.device < 0 ? 0 : info.device, out);
    }
  }
  return Status::kInvalidParam;
}

void GpuDirectBackend::dereg(const rcache::Registration& reg) noexcept {
  auto* mr = static_cast<ibv_mr*>(reg.handle);
  if (mr == nullptr) return;
  const int err = ops_->deregMr(mr);
  if (err != 0) {
    log(LogLevel::kError, detail::kLogModule, "ibv_dereg_mr failed: %s", std::strerror(err));
  }
}

GpuDirectStats GpuDirectBackend::stats() const noexcept {
  GpuDirectStats s;
  s.host_regs = host_regs_.load(std::memory_order_relaxed);
  s.dmabuf_regs = dmabuf_regs_.load(std::memory_order_relaxed);
  s.peermem_regs = peermem_regs_.load(std::memory_order_relaxed);
  s.unsupported = unsupported_.load(std::memory_order_relaxed);
  s.dmabuf_demotions = demotions_.load(std::memory_order_relaxed);
  return s;
}

}  // namespace gmd::memtype
