// GPUDirect RDMA: registers CUDA device memory with the MD's verbs protection domain. It lives with
// the MD that owns the protection domain; host pages go through VerbsBackend (md/verbs_backend.h),
// and memtype/ only classifies (the registrar's resolver hands the device on, so nothing is
// classified twice).
//
// Per device, in this order (the first that the device and the system support is chosen once and
// remembered; a dma-buf registration that fails for a reason other than resources demotes the
// device to peer memory for good, if the policy allows):
//   1. dma-buf, when libibverbs has ibv_reg_dmabuf_mr, the GPU exports dma-bufs
//      (CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED) and this MD's NIC imports them. The NIC is probed
//      once per backend (per protection domain), as UCX's IB MD does: ibv_reg_dmabuf_mr of one page
//      with fd -1 fails with EBADF where the driver imports dma-bufs (it got as far as the fd), and
//      with EOPNOTSUPP (libibverbs' stub for a provider without the verb, e.g. rxe) or anything
//      else where it does not.
//      Registering: cuMemGetHandleForAddressRange on the page-aligned range (with the PCIe mapping
//      flag, then without) gives an fd; ibv_reg_dmabuf_mr(offset, length, iova = device address,
//      fd); the fd is closed right after, the MR keeps its own reference.
//   2. peer memory: ibv_reg_mr on the device pointer, when a peer-memory kernel module is loaded
//      (/sys/module/nvidia_peermem, /sys/kernel/mm/memory_peers/nv_mem, /sys/module/nv_peer_mem).
//   3. neither: kUnsupported, and cudaSupported() is false, so the MD leaves CUDA out of
//      reg_mem_types.
// Host and managed memory are not this backend's: kUnsupported.
//
// Before registering device memory (either method) the backend asks the driver for synchronous
// memory operations on the allocation (CU_POINTER_ATTRIBUTE_SYNC_MEMOPS), as UCX does for device
// buffers: otherwise an RDMA read may overtake a cuMemcpy the application issued just before. A
// failure is logged (debug when the driver cannot, else warn, once per backend) and the
// registration goes on, as in UCX.
//
// Thread safety: reg()/dereg() may run concurrently on any thread (per-device probe results are
// atomics; the worst race is two threads probing the same device once each). The backend never
// calls into a registration cache.
#pragma once

#include <infiniband/verbs.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "md/verbs_backend.h"
#include "rcache/rcache.h"

namespace gmd::md {

// Whether device memory is registered through dma-buf (UCX_GMD_DMABUF; the values are the indices
// of kDmabufPolicyNames, which UCX's parser fills in directly).
enum class DmabufPolicy : unsigned {
  kTry = 0,  // dma-buf when the GPU, libibverbs and the NIC support it, else peer memory (default)
  kOn = 1,   // dma-buf only: never fall back to peer memory
  kOff = 2,  // never dma-buf: peer memory only
};
extern const char* kDmabufPolicyNames[];  // "try", "on", "off", nullptr

enum class GpuDirectMethod : std::uint8_t { kUnknown, kDmabuf, kPeerMem, kUnsupported };
const char* gpuDirectMethodName(GpuDirectMethod m) noexcept;

struct GpuDirectConfig {
  DmabufPolicy dmabuf = DmabufPolicy::kTry;
};

// The backend's effects on the world, injectable for tests: the verbs calls (VerbsOps), sysfs and
// the CUDA driver. Failing verbs calls set errno; driver calls return a nonzero CUresult.
class GpuDirectOps : public VerbsOps {
 public:
  // Also the NIC's dma-buf probe: offset 0, one page, iova 0, fd -1 (see the file comment).
  virtual ibv_mr* regDmabufMr(ibv_pd* pd, std::uint64_t offset, std::size_t length,
                              std::uint64_t iova, int fd, int access) noexcept = 0;
  virtual bool pathExists(const char* path) noexcept = 0;
  virtual bool verbsHasDmabuf() noexcept = 0;             // libibverbs has ibv_reg_dmabuf_mr
  virtual bool deviceHasDmabuf(int device) noexcept = 0;  // CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED
  // cuMemGetHandleForAddressRange(DMA_BUF_FD) on a page-aligned range; 0 and *fd, or a CUresult.
  virtual int exportDmabuf(std::uintptr_t start, std::size_t length, bool pcie,
                           int* fd) noexcept = 0;
  virtual void closeFd(int fd) noexcept = 0;
  // The size of a dma-buf (lseek to its end), or -1.
  virtual std::int64_t dmabufSize(int fd) noexcept = 0;
  // CU_POINTER_ATTRIBUTE_SYNC_MEMOPS on the allocation holding ptr (memtype::setSyncMemops): 0, -1
  // when the driver cannot (no driver, no cuPointerSetAttribute), else the CUresult.
  virtual int setSyncMemops(std::uintptr_t ptr) noexcept = 0;
};

// The real thing: libibverbs, sysfs, and the CUDA driver memtype/ loaded.
class SystemGpuDirectOps : public GpuDirectOps {
 public:
  ibv_mr* regMr(ibv_pd* pd, void* addr, std::size_t length, int access) noexcept override;
  int deregMr(ibv_mr* mr) noexcept override;
  ibv_mr* regDmabufMr(ibv_pd* pd, std::uint64_t offset, std::size_t length, std::uint64_t iova,
                      int fd, int access) noexcept override;
  bool pathExists(const char* path) noexcept override;
  bool verbsHasDmabuf() noexcept override;
  bool deviceHasDmabuf(int device) noexcept override;
  int exportDmabuf(std::uintptr_t start, std::size_t length, bool pcie, int* fd) noexcept override;
  void closeFd(int fd) noexcept override;
  std::int64_t dmabufSize(int fd) noexcept override;
  int setSyncMemops(std::uintptr_t ptr) noexcept override;
};

// A dma-buf the caller already holds for the memory it registers: UCP passes one in mem_reg (from
// UCX 1.14, to an MD that advertises UCT_MD_FLAG_REG_DMABUF) when another MD, UCX's cuda_copy,
// exported it; `address` is at byte `offset` of it. Offered for one registration on the calling
// thread, while the object lives: a dma-buf registration on this thread uses it instead of
// exporting one where it covers the range, and never closes it (the caller does).
class DmabufOffer {
 public:
  DmabufOffer(int fd, std::uintptr_t address, std::size_t offset) noexcept;
  ~DmabufOffer();
  DmabufOffer(const DmabufOffer&) = delete;
  DmabufOffer& operator=(const DmabufOffer&) = delete;
  static const DmabufOffer* current() noexcept;

  int fd() const noexcept { return fd_; }
  // The address at the dma-buf's first byte.
  std::uintptr_t base() const noexcept { return base_; }

 private:
  int fd_;
  std::uintptr_t base_;
  const DmabufOffer* outer_;
};

struct GpuDirectStats {
  std::uint64_t dmabuf_regs = 0;
  std::uint64_t dmabuf_offered = 0;        // of those, on the caller's dma-buf (DmabufOffer)
  std::uint64_t peermem_regs = 0;
  std::uint64_t unsupported = 0;           // requests refused (no method, not device memory)
  std::uint64_t dmabuf_demotions = 0;      // devices moved from dma-buf to peer memory
  std::uint64_t sync_memops_failures = 0;  // SYNC_MEMOPS not set (the registration went on)
};

class GpuDirectBackend final : public rcache::Backend {
 public:
  static constexpr int kMaxDevices = 64;

  // `pd` is borrowed and must outlive the backend. `ops` (borrowed) defaults to SystemGpuDirectOps.
  explicit GpuDirectBackend(ibv_pd* pd, const GpuDirectConfig& config = {},
                            GpuDirectOps* ops = nullptr) noexcept;

  // memory.device: the CUDA device of kCuda memory as the registrar's classification found it
  // (classified here when the caller passes -1).
  Result reg(std::uintptr_t start, std::size_t length, unsigned access, MemoryKind memory,
             rcache::Registration* out) noexcept override;
  void dereg(const rcache::Registration& reg) noexcept override;
  const char* name() const noexcept override { return "gpudirect"; }

  // Whether the MD may advertise CUDA in reg_mem_types: a driver with devices, and every device has
  // a method other than kUnsupported. Probes each device once.
  bool cudaSupported() noexcept;
  // The method chosen for `device` (probing it on first use).
  GpuDirectMethod method(int device) noexcept;
  // Whether this MD's NIC imports dma-bufs (probed on first use, once; false without the verb).
  bool nicImportsDmabuf() noexcept;
  // Whether a registration here can take the caller's dma-buf (UCT_MD_FLAG_REG_DMABUF): some GPU's
  // method is dma-buf.
  bool takesDmabuf() noexcept;
  const GpuDirectConfig& config() const noexcept { return config_; }
  GpuDirectStats stats() const noexcept;

 private:
  GpuDirectMethod probe(int device) noexcept;
  bool peerMemLoaded() noexcept;
  void syncMemops(std::uintptr_t start) noexcept;
  Result regDevice(std::uintptr_t start, std::size_t length, int access, int device,
                   rcache::Registration* out) noexcept;
  Result regDmabuf(std::uintptr_t start, std::size_t length, int access, int device,
                   ibv_mr** mr) noexcept;
  Result regOffered(const DmabufOffer& offer, std::uintptr_t start, std::size_t length, int access,
                    ibv_mr** mr) noexcept;
  Result regPeerMem(std::uintptr_t start, std::size_t length, int access, ibv_mr** mr) noexcept;

  ibv_pd* pd_;
  GpuDirectConfig config_;
  SystemGpuDirectOps system_ops_;
  GpuDirectOps* ops_;
  std::atomic<GpuDirectMethod> methods_[kMaxDevices];
  std::atomic<int> pcie_flag_[kMaxDevices];  // -1 unknown, 1 accepted, 0 rejected
  std::atomic<int> peermem_{-1};             // -1 unknown, else 0/1
  std::atomic<int> nic_dmabuf_{-1};          // -1 unknown, else 0/1
  std::atomic<bool> sync_memops_warned_{false};
  std::atomic<std::uint64_t> dmabuf_regs_{0}, dmabuf_offered_{0}, peermem_regs_{0}, unsupported_{0},
      demotions_{0}, sync_memops_failures_{0};
};

}  // namespace gmd::md
