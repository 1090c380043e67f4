// A fake CUDA driver for gmd's unit tests, built as libcuda.so.1 in its own folder and found first
// on LD_LIBRARY_PATH (or through GMD_CUDA_DRIVER_PATH). It implements the driver API subset that
// memtype/, md/ and their tests use, with "device" memory simulated by host memory. Entry points
// (real names and signatures; reachable by dlsym and by cuGetProcAddress):
//
//   init/devices: cuInit, cuDriverGetVersion, cuDeviceGetCount, cuDeviceGet, cuDeviceGetAttribute,
//     cuDeviceGetPCIBusId, cuGetProcAddress (11.3 and 12 signatures: cuGetProcAddress(_v2)).
//   memory: cuMemAlloc(_v2), cuMemAllocPitch(_v2), cuMemFree(_v2), cuMemAllocManaged,
//     cuMemAllocAsync(_ptsz), cuMemFreeAsync(_ptsz), cuMemGetAddressRange(_v2),
//     cuMemGetHandleForAddressRange (a memfd stands in for the dma-buf), VMM: cuMemAddressReserve,
//     cuMemAddressFree, cuMemCreate, cuMemMap, cuMemUnmap, cuMemRelease, cuMemSetAccess,
//     cuMemGetAllocationGranularity.
//   pointers: cuPointerGetAttribute(s) (CONTEXT, MEMORY_TYPE, SYNC_MEMOPS, BUFFER_ID, IS_MANAGED,
//     DEVICE_ORDINAL, RANGE_START_ADDR, RANGE_SIZE, MAPPED), cuPointerSetAttribute (SYNC_MEMOPS,
//     from an unsigned int; read back as a one-byte bool, the type the driver documents).
//   copies: cuMemcpy(_ptds), cuMemcpyAsync(_ptsz), cuMemcpyHtoD/DtoH/DtoD (v1 32-bit, _v2,
//     _v2_ptds), cuMemcpyHtoDAsync/DtoHAsync/DtoDAsync (v1, _v2, _v2_ptsz), cuMemsetD8 (v1, _v2,
//     _v2_ptds).
//   streams/events: cuStreamCreate, cuStreamDestroy(_v2), cuStreamSynchronize(_ptsz),
//     cuStreamQuery(_ptsz), cuStreamWaitEvent(_ptsz), cuEventCreate, cuEventRecord(_ptsz),
//     cuEventQuery, cuEventSynchronize, cuEventDestroy(_v2), cuCtxSynchronize.
//   contexts: cuDevicePrimaryCtxRetain/Release(_v2), cuCtxSetCurrent/GetCurrent,
//     cuCtxPushCurrent(_v2), cuCtxPopCurrent(_v2), cuCtxGetDevice.
//   for UCX's own CUDA transports (libuct_cuda): cuDeviceGetName, cuDeviceTotalMem_v2,
//     cuDeviceGetUuid(_v2), cuGetErrorString/Name, cuCtxGetApiVersion, cuCtxGetId,
//     cuDevicePrimaryCtxGetState, cuMemHostRegister(_v2)/cuMemHostUnregister (remembered, not
//     pinned), cuMemRangeGetAttribute (managed memory, no advice), cuStreamAddCallback,
//     cuMemRetainAllocationHandle, cuMemGetAllocationPropertiesFromHandle, cuIpcGetMemHandle (its
//     handles cannot be opened), cuIpcOpenMemHandle_v2, cuIpcCloseMemHandle; shareable VMM handles
//     and memory pools answer CUDA_ERROR_NOT_SUPPORTED.
// On x86-64 the allocation and free entry points UCX's libucm patches are stubs it can patch (see
// "Entry points that UCX's libucm patches in place" below).
// cuGetProcAddress hands out the _v2 (and, with CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, the
// _ptds/_ptsz) implementation of a base name from the version where the real driver does.
//
// Memory. Device, managed and async allocations come first-fit from one arena placed below 4 GiB
// (so that the 32-bit v1 entry points can be exercised); freed space is reused lowest address
// first, so a re-allocation of the same size lands at the same address with a new buffer ID, as on
// a real device. The arena is a MAP_SHARED mapping of one memfd (so ibv_reg_mr can pin it). A free
// punches a hole in the memfd (fallocate PUNCH_HOLE|KEEP_SIZE): a re-allocation there reads zeros,
// never the old bytes, while a registration that pinned the old pages (an RDMA MR) keeps them,
// which is how stale registrations show in tests. No munmap or madvise is issued on a free, and the
// mappings the fake changes are made with raw system calls, so memory hooks (libucm) see nothing
// the real driver would not show them. VMM: each cuMemCreate handle is a memfd of its own, mapped
// over the reserved arena range by cuMemMap; cuMemUnmap puts the (hole) arena view back, and the
// handle's pages go when it is released and unmapped.
//
// GMD_FAKE_CUDA_CPU_ACCESS (read when the arena is made, at cuInit): unset or 1, device memory is
// CPU-accessible at its device address (the tests that write it directly, and GPUDirect through
// peer memory in a VM, need that). 0: device memory (cuMemAlloc*, async, VMM) is mapped PROT_NONE,
// so any CPU touch faults (SIGSEGV) as on a discrete GPU; managed memory stays CPU-accessible. The
// fake itself always moves bytes through a read-write alias mapping of the same memfds.
//
// Contexts. A context is a token (device + 1): the device's primary context. Each thread has a
// context stack; a thread that never touched it has one entry, the primary context of the
// "current device" (the current_device control; cuCtxSetCurrent on that entry moves it, for every
// such thread). cuCtxSetCurrent(NULL) or popping the last entry leaves the thread without a
// context: then allocations, copies, memsets, stream and event calls (but cuEventQuery, as
// documented) answer CUDA_ERROR_INVALID_CONTEXT (201). Allocations land on the current context's
// device.
//
// Copies validate like the driver: a pointer in the arena must lie in a live allocation and the
// range must not run past its end; any other pointer is host memory and must be readable (and the
// destination writable): else CUDA_ERROR_INVALID_VALUE. Host memory is accessed with
// process_vm_readv/writev on the process itself, so a bad host pointer is an error, not a crash.
// Sync copies and memsets, and async ones on the NULL/legacy stream, run on the calling thread
// after the blocking streams drained (the legacy stream's implicit synchronisation). Async copies
// on a created stream are validated when queued and run in order on that stream's own worker
// thread, each after copy_delay_us; an event marks a stream position and cuEventQuery/cuStreamQuery
// answer CUDA_ERROR_NOT_READY (600) until the worker reached it; cuStreamWaitEvent queues a wait
// for another stream's position (on the NULL stream the caller waits). A host fault inside an async
// copy makes the stream answer CUDA_ERROR_ILLEGAL_ADDRESS (700) from then on. Frees, cuMemUnmap,
// cuMemRelease and cuCtxSynchronize wait for every stream. cuStreamDestroy waits for the stream's
// queued work.
//
// PCI bus ids: device d answers GMD_FAKE_CUDA_PCI_BUS_IDS's d-th comma-separated entry when the
// variable is set (read at each call), else 0000:<0x3b + d>:00.0. cuDeviceGetAttribute's PCI
// domain, bus and device attributes agree with it.
//
// Test controls (exported, C linkage): gmd_fake_cuda_driver (marker), gmd_fake_cuda_set(key,
// value), gmd_fake_cuda_get(key); unknown keys get -1.
//   set: devices, current_device, dmabuf_supported, dmabuf_pcie, dmabuf_fail, copy_delay_us
//     (also GMD_FAKE_CUDA_COPY_DELAY_US at cuInit), copy_error (non-zero: every copy and memset
//     call answers this CUresult and moves nothing), hold_streams (non-zero: stream workers start
//     no new operation until it is 0 again; cuStreamDestroy still drains, and whatever waits for
//     the streams, a free or a legacy-stream copy among them, waits for the release),
//     reset_thread_context (the calling thread's context stack goes back to the untouched state).
//   get: live_allocations, pointer_queries, frees, last_dmabuf_fd, last_dmabuf_flags,
//     dmabuf_exports, arena, handles, cpu_access (0/1), arena_bytes (bytes the arena memfd holds),
//     devices, host_registered (ranges registered with cuMemHostRegister),
//     copies_{htod,dtoh,dtod,htoh} and bytes_{htod,dtoh,dtod,htoh} (completed copies, sync and
//     async; managed memory counts as device), async_copies (queued on created streams), memsets,
//     bytes_memset, sync_memops_set (successful SYNC_MEMOPS sets), streams, events (live),
//     copy_delay_us.
// Built with -Bsymbolic so that its own references (e.g. the table behind cuGetProcAddress) bind to
// its functions, not to gmd's redirected symbols. Every exported function is noexcept and returns a
// CUresult; nothing throws out of it.
#include <fcntl.h>
#include <linux/falloc.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#ifndef GMD_FAKE_CUDA_DEFAULT_DEVICES
#define GMD_FAKE_CUDA_DEFAULT_DEVICES 1
#endif

namespace {

using CUresult = int;
using CUdeviceptr = std::uint64_t;
using CUhandle = std::uint64_t;
using CUstream = void*;
using CUevent = void*;
using CUcontext = void*;

constexpr CUresult kSuccess = 0;
constexpr CUresult kInvalidValue = 1;             // CUDA_ERROR_INVALID_VALUE
constexpr CUresult kOutOfMemory = 2;              // CUDA_ERROR_OUT_OF_MEMORY
constexpr CUresult kNotInitialized = 3;           // CUDA_ERROR_NOT_INITIALIZED
constexpr CUresult kNoDevice = 100;               // CUDA_ERROR_NO_DEVICE
constexpr CUresult kInvalidDevice = 101;          // CUDA_ERROR_INVALID_DEVICE
constexpr CUresult kInvalidContext = 201;         // CUDA_ERROR_INVALID_CONTEXT
constexpr CUresult kInvalidHandle = 400;          // CUDA_ERROR_INVALID_HANDLE
constexpr CUresult kNotFound = 500;               // CUDA_ERROR_NOT_FOUND
constexpr CUresult kNotReady = 600;               // CUDA_ERROR_NOT_READY
constexpr CUresult kIllegalAddress = 700;         // CUDA_ERROR_ILLEGAL_ADDRESS
constexpr CUresult kHostAlreadyRegistered = 712;  // CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED
constexpr CUresult kHostNotRegistered = 713;      // CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED
constexpr CUresult kNotSupported = 801;           // CUDA_ERROR_NOT_SUPPORTED

constexpr int kAttrContext = 1;     // CU_POINTER_ATTRIBUTE_CONTEXT
constexpr int kAttrSyncMemops = 6;  // CU_POINTER_ATTRIBUTE_SYNC_MEMOPS

constexpr std::size_t kArenaSize = 512ul << 20;
// Below 4 GiB, and below AddressSanitizer's shadow (which starts just under 2 GiB).
constexpr std::uintptr_t kArenaHints[] = {0x40000000, 0x10000000};
constexpr std::size_t kGranule = 64 * 1024;

enum class Kind { kDevice, kManaged, kMapped };
struct Alloc {
  std::size_t size = 0;
  std::uint64_t id = 0;
  Kind kind = Kind::kDevice;
  CUhandle handle = 0;     // kMapped: the cuMemCreate handle
  std::size_t offset = 0;  // kMapped: offset into the handle
  int device = 0;
  bool sync_memops = false;
};
struct Handle {
  std::size_t size = 0;
  int mappings = 0;
  bool released = false;
  int device = 0;
  int requested_types = 0;  // CUmemAllocationProp.requestedHandleTypes at cuMemCreate
  int retains = 0;          // cuMemRetainAllocationHandle references not yet released
  int fd = -1;              // the handle's "physical" pages
  char* alias = nullptr;    // read-write view of them, for the fake's own copies
};

// Guards everything below up to the controls; never held while waiting for a stream.
std::mutex g_mu;
std::atomic<bool> g_initialized{false};
std::uintptr_t g_arena = 0;
int g_arena_fd = -1;
char* g_alias = nullptr;                           // read-write view of the arena memfd
std::map<std::uintptr_t, std::size_t> g_free;      // free VA: start -> size
std::map<std::uintptr_t, Alloc> g_allocs;          // live allocations and mappings
std::map<std::uintptr_t, std::size_t> g_reserved;  // cuMemAddressReserve ranges
std::map<CUhandle, Handle> g_handles;
std::map<std::uintptr_t, std::size_t> g_host_registered;  // cuMemHostRegister: start -> size
std::uint64_t g_next_id = 1000;
CUhandle g_next_handle = 1;

// Test controls.
std::atomic<long> g_devices{-1};  // -1: GMD_FAKE_CUDA_DEVICES, else the built-in default
std::atomic<long> g_current_device{0};
std::atomic<long> g_dmabuf_supported{1};
std::atomic<long> g_dmabuf_pcie{1};  // accepts CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE
std::atomic<long> g_dmabuf_fail{0};
std::atomic<long> g_last_dmabuf_fd{-1};
std::atomic<long> g_last_dmabuf_flags{-1};
std::atomic<long> g_dmabuf_exports{0};
std::atomic<long> g_pointer_queries{0};
std::atomic<long> g_frees{0};
std::atomic<bool> g_cpu_access{true};
std::atomic<long> g_copy_delay_us{0};
std::atomic<long> g_copy_error{0};
std::atomic<bool> g_hold_streams{false};  // workers start nothing new while set
std::atomic<bool> g_vm_rw{true};          // process_vm_readv/writev usable on ourselves

// Copy counters, by direction: 0 htod, 1 dtoh, 2 dtod, 3 htoh.
std::atomic<long> g_copies[4];
std::atomic<long> g_bytes[4];
std::atomic<long> g_async_copies{0};
std::atomic<long> g_memsets{0};
std::atomic<long> g_bytes_memset{0};
std::atomic<long> g_sync_memops_set{0};
std::atomic<long> g_streams_live{0};
std::atomic<long> g_events_live{0};

long devices() noexcept {
  long d = g_devices.load();
  if (d >= 0) return d;
  const char* env = std::getenv("GMD_FAKE_CUDA_DEVICES");
  return env != nullptr ? std::atol(env) : GMD_FAKE_CUDA_DEFAULT_DEVICES;
}

// Device d's PCI address (see the top comment). False when the variable names no such entry or
// the entry is not domain:bus:device.function in hex.
bool pciAddress(int device, unsigned* domain, unsigned* bus, unsigned* slot,
                unsigned* function) noexcept {
  const char* env = std::getenv("GMD_FAKE_CUDA_PCI_BUS_IDS");
  if (env == nullptr || env[0] == '\0') {
    *domain = 0;
    *bus = 0x3b + static_cast<unsigned>(device);
    *slot = 0;
    *function = 0;
    return true;
  }
  const char* entry = env;
  for (int i = 0; i < device && entry != nullptr; ++i) {
    entry = std::strchr(entry, ',');
    if (entry != nullptr) ++entry;
  }
  return entry != nullptr && std::sscanf(entry, "%x:%x:%x.%x", domain, bus, slot, function) == 4;
}

// ---- Mappings, made with raw system calls (memory hooks must not see the fake's own remaps).

void* rawMmap(void* addr, std::size_t len, int prot, int flags, int fd, off_t off) noexcept {
  return reinterpret_cast<void*>(syscall(SYS_mmap, addr, len, prot, flags, fd, off));
}
void rawMunmap(void* addr, std::size_t len) noexcept { syscall(SYS_munmap, addr, len); }

int devicePerm() noexcept { return g_cpu_access.load() ? PROT_READ | PROT_WRITE : PROT_NONE; }

// Whether process_vm_readv works on ourselves (a seccomp profile may forbid it): without it host
// memory is accessed directly and a bad host pointer crashes instead of failing the copy.
bool probeVmRw() noexcept {
  char src = 1, dst = 0;
  iovec l{&dst, 1}, r{&src, 1};
  return process_vm_readv(getpid(), &l, 1, &r, 1, 0) == 1 && dst == 1;
}

// Caller holds g_mu.
bool ensureArena() noexcept {
  if (g_arena != 0) return true;
  const char* access = std::getenv("GMD_FAKE_CUDA_CPU_ACCESS");
  g_cpu_access = !(access != nullptr && std::strcmp(access, "0") == 0);
  const char* delay = std::getenv("GMD_FAKE_CUDA_COPY_DELAY_US");
  if (delay != nullptr && delay[0] != '\0') g_copy_delay_us = std::atol(delay);
  g_vm_rw = probeVmRw();
  const int fd = memfd_create("gmd-fake-cuda-arena", MFD_CLOEXEC);
  if (fd < 0) return false;
  if (ftruncate(fd, static_cast<off_t>(kArenaSize)) != 0) {
    close(fd);
    return false;
  }
  void* p = MAP_FAILED;
  for (std::uintptr_t hint : kArenaHints) {
    p = rawMmap(reinterpret_cast<void*>(hint), kArenaSize, devicePerm(),
                MAP_SHARED | MAP_FIXED_NOREPLACE, fd, 0);
    if (p != MAP_FAILED) break;
  }
  if (p == MAP_FAILED) p = rawMmap(nullptr, kArenaSize, devicePerm(), MAP_SHARED, fd, 0);
  void* alias = p == MAP_FAILED
                    ? MAP_FAILED
                    : rawMmap(nullptr, kArenaSize, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (alias == MAP_FAILED) {
    if (p != MAP_FAILED) rawMunmap(p, kArenaSize);
    close(fd);
    return false;
  }
  g_arena = reinterpret_cast<std::uintptr_t>(p);
  g_arena_fd = fd;
  g_alias = static_cast<char*>(alias);
  try {
    g_free[g_arena] = kArenaSize;
  } catch (...) {
    return false;
  }
  return true;
}

std::size_t roundUp(std::size_t n) noexcept { return (n + kGranule - 1) & ~(kGranule - 1); }

// Drops the pages behind [start, start + size) of the arena (a re-allocation there reads zeros).
// Caller holds g_mu.
void punchArena(std::uintptr_t start, std::size_t size) noexcept {
  const off_t off = static_cast<off_t>(start - g_arena);
  if (fallocate(g_arena_fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, off,
                static_cast<off_t>(size)) != 0) {
    std::memset(g_alias + off, 0, size);  // a kernel without hole punching for shmem
  }
}

// Caller holds g_mu.
std::uintptr_t takeVa(std::size_t size) noexcept {
  if (!ensureArena()) return 0;
  size = roundUp(size);
  try {
    for (auto it = g_free.begin(); it != g_free.end(); ++it) {
      if (it->second >= size) {
        const std::uintptr_t start = it->first;
        const std::size_t left = it->second - size;
        g_free.erase(it);
        if (left != 0) g_free[start + size] = left;
        return start;
      }
    }
  } catch (...) {
  }
  return 0;
}

// Caller holds g_mu.
void giveVa(std::uintptr_t start, std::size_t size) noexcept {
  size = roundUp(size);
  punchArena(start, size);
  auto next = g_free.lower_bound(start);
  if (next != g_free.end() && start + size == next->first) {
    size += next->second;
    next = g_free.erase(next);
  }
  if (next != g_free.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == start) {
      prev->second += size;
      return;
    }
  }
  try {
    g_free[start] = size;
  } catch (...) {
    // The range is lost to the arena; the fake goes on with less.
  }
}

// Caller holds g_mu. The live allocation or mapping holding ptr, or end().
std::map<std::uintptr_t, Alloc>::iterator findAlloc(CUdeviceptr ptr) noexcept {
  auto it = g_allocs.upper_bound(ptr);
  if (it == g_allocs.begin()) return g_allocs.end();
  --it;
  return ptr < it->first + it->second.size ? it : g_allocs.end();
}

// Caller holds g_mu. Whether ptr lies in host memory registered with cuMemHostRegister.
bool hostRegistered(std::uintptr_t ptr) noexcept {
  auto it = g_host_registered.upper_bound(ptr);
  if (it == g_host_registered.begin()) return false;
  --it;
  return ptr < it->first + it->second;
}

// ---- Contexts: per-thread stacks of tokens (device + 1). kFollow stands for the primary context
// of the current device (the current_device control), the state of a thread that never set one.

constexpr std::uintptr_t kFollow = ~std::uintptr_t{0};
constexpr int kMaxCtxDepth = 64;
struct CtxStack {
  int depth = 1;
  std::uintptr_t slots[kMaxCtxDepth] = {kFollow};
};
thread_local CtxStack t_ctx;

std::uintptr_t resolveCtx(std::uintptr_t slot) noexcept {
  return slot == kFollow ? static_cast<std::uintptr_t>(g_current_device.load()) + 1 : slot;
}
// The calling thread's current context token, 0 for none.
std::uintptr_t currentCtx() noexcept {
  return t_ctx.depth > 0 ? resolveCtx(t_ctx.slots[t_ctx.depth - 1]) : 0;
}
bool validCtx(std::uintptr_t token) noexcept {
  return token != 0 && token != kFollow && static_cast<long>(token) <= devices();
}
int currentDevice() noexcept {
  const std::uintptr_t c = currentCtx();
  return c != 0 ? static_cast<int>(c - 1) : static_cast<int>(g_current_device.load());
}

// ---- Copies.

// One side of a copy: where the fake reads or writes it (the alias view for device memory).
struct Side {
  char* p = nullptr;
  bool device = false;
};

// Caller holds g_mu. Resolves [ptr, ptr + len) (len > 0) as device memory (a live allocation,
// the range inside it) or, outside the arena, host memory. want_device: device memory required.
CUresult resolve(CUdeviceptr ptr, std::size_t len, bool want_device, Side* out) noexcept {
  if (ptr == 0 || ptr + len < ptr) return kInvalidValue;
  const bool in_arena = g_arena != 0 && ptr < g_arena + kArenaSize && ptr + len > g_arena;
  if (!in_arena) {
    if (want_device) return kInvalidValue;
    out->p = reinterpret_cast<char*>(ptr);
    out->device = false;
    return kSuccess;
  }
  auto it = findAlloc(ptr);
  if (it == g_allocs.end() || ptr + len > it->first + it->second.size) return kInvalidValue;
  if (it->second.kind == Kind::kMapped) {
    auto h = g_handles.find(it->second.handle);
    if (h == g_handles.end() || h->second.alias == nullptr) return kInvalidValue;
    out->p = h->second.alias + it->second.offset + (ptr - it->first);
  } else {
    out->p = g_alias + (ptr - g_arena);
  }
  out->device = true;
  return kSuccess;
}

// Moves len bytes of ourselves from remote to local (read) or local to remote (write), failing on
// a fault on either side.
bool vmMove(void* local, const void* remote, std::size_t len, bool read) noexcept {
  std::size_t done = 0;
  while (done < len) {
    iovec l{static_cast<char*>(local) + done, len - done};
    iovec r{const_cast<char*>(static_cast<const char*>(remote)) + done, len - done};
    const ssize_t n = read ? process_vm_readv(getpid(), &l, 1, &r, 1, 0)
                           : process_vm_writev(getpid(), &l, 1, &r, 1, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<std::size_t>(n);
  }
  return true;
}

// Whether host memory at p (len > 0) can be read: its first and last byte.
bool hostReadable(const char* p, std::size_t len) noexcept {
  if (!g_vm_rw.load()) return true;
  char buf[2];
  return vmMove(buf, p, 1, true) && vmMove(buf + 1, p + len - 1, 1, true);
}

int direction(const Side& dst, const Side& src) noexcept {
  if (src.device) return dst.device ? 2 : 1;
  return dst.device ? 0 : 3;
}

// Moves the bytes. kInvalidValue when host memory faulted.
CUresult execCopy(const Side& dst, const Side& src, std::size_t len) noexcept {
  bool ok = true;
  if ((dst.device && src.device) || !g_vm_rw.load()) {
    std::memmove(dst.p, src.p, len);
  } else if (src.device) {
    ok = vmMove(src.p, dst.p, len, false);  // to host memory
  } else {
    ok = vmMove(dst.p, src.p, len, true);  // from host memory (host to host: dst is local)
  }
  if (!ok) return kInvalidValue;
  const int d = direction(dst, src);
  g_copies[d].fetch_add(1);
  g_bytes[d].fetch_add(static_cast<long>(len));
  return kSuccess;
}

void execMemset(const Side& dst, unsigned char value, std::size_t len) noexcept {
  std::memset(dst.p, value, len);
  g_memsets.fetch_add(1);
  g_bytes_memset.fetch_add(static_cast<long>(len));
}

// ---- Streams and events.

struct Stream;
struct Op {
  Side dst, src;
  std::size_t len = 0;
  bool memset = false;
  unsigned char value = 0;
  std::shared_ptr<Stream> wait_on;  // cuStreamWaitEvent: wait until wait_on completed wait_target
  std::uint64_t wait_target = 0;
  void (*callback)(CUstream, CUresult, void*) = nullptr;  // cuStreamAddCallback
  void* user_data = nullptr;
};

// A created stream: its worker runs the queued operations in order. Shared by the registry, the
// worker and the events recorded on it. Thread-safe: every field below mu_ is guarded by it.
struct Stream {
  unsigned flags = 0;  // CU_STREAM_NON_BLOCKING = 1
  int device = 0;
  std::mutex mu;
  std::condition_variable cv;  // signalled on every queue, completion and stop
  std::deque<Op> queue;
  std::uint64_t submitted = 0;
  std::uint64_t completed = 0;
  CUresult error = kSuccess;  // sticky: the first failure of a queued operation
  bool stop = false;
  std::thread worker;

  void run() noexcept {
    std::unique_lock<std::mutex> lock(mu);
    for (;;) {
      cv.wait(lock, [this] {
        return (!queue.empty() && (stop || !g_hold_streams.load())) || (stop && queue.empty());
      });
      if (queue.empty()) return;
      const Op op = queue.front();
      lock.unlock();
      const long delay = g_copy_delay_us.load();
      if (delay > 0) std::this_thread::sleep_for(std::chrono::microseconds(delay));
      CUresult r = kSuccess;
      if (op.wait_on) {
        op.wait_on->waitFor(op.wait_target);
      } else if (op.callback != nullptr) {
        CUresult status;
        {
          std::lock_guard<std::mutex> slock(mu);
          status = error;
        }
        op.callback(this, status, op.user_data);
      } else if (op.memset) {
        execMemset(op.dst, op.value, op.len);
      } else {
        r = execCopy(op.dst, op.src, op.len);
      }
      lock.lock();
      queue.pop_front();
      if (r != kSuccess && error == kSuccess) error = kIllegalAddress;
      ++completed;
      cv.notify_all();
    }
  }
  // Waits until the first `target` operations completed.
  CUresult waitFor(std::uint64_t target) noexcept {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return completed >= target; });
    return error;
  }
  CUresult drain() noexcept {
    std::uint64_t target;
    {
      std::lock_guard<std::mutex> lock(mu);
      target = submitted;
    }
    return waitFor(target);
  }
};

// A position in a stream (the stream's submitted count when recorded); complete once the stream's
// completed count reaches it. Its fields are guarded by g_stream_mu.
struct Event {
  unsigned flags = 0;
  std::shared_ptr<Stream> stream;  // null: never recorded, or recorded on the legacy stream
  std::uint64_t target = 0;
};

// Registries, never destroyed: a stream's worker may outlive static destruction at exit.
// Lock order: g_stream_mu, then a Stream's mu. g_mu is never held with either (nor while waiting
// for a stream); workers take only their own Stream's mu (and wait on another's for a
// cuStreamWaitEvent, holding none).
std::mutex g_stream_mu;  // guards the two registries and every Event's fields
std::map<void*, std::shared_ptr<Stream>>& streams() noexcept {
  static auto* m = new std::map<void*, std::shared_ptr<Stream>>;
  return *m;
}
std::map<void*, Event*>& events() noexcept {
  static auto* m = new std::map<void*, Event*>;
  return *m;
}

// The special stream handles: NULL, CU_STREAM_LEGACY (1), CU_STREAM_PER_THREAD (2).
bool isNullStream(CUstream s) noexcept { return reinterpret_cast<std::uintptr_t>(s) <= 2; }

CUresult findStream(CUstream s, std::shared_ptr<Stream>* out) noexcept {
  std::lock_guard<std::mutex> lock(g_stream_mu);
  auto it = streams().find(s);
  if (it == streams().end()) return kInvalidHandle;
  *out = it->second;
  return kSuccess;
}

// Waits for every created stream's work so far (blocking_only: the legacy stream's implicit
// synchronisation, which spares CU_STREAM_NON_BLOCKING streams). Returns the first sticky error.
CUresult drainStreams(bool blocking_only) noexcept {
  std::vector<std::shared_ptr<Stream>> all;
  try {
    std::lock_guard<std::mutex> lock(g_stream_mu);
    for (const auto& s : streams()) {
      if (!blocking_only || (s.second->flags & 1u) == 0) all.push_back(s.second);
    }
  } catch (...) {
    return kOutOfMemory;
  }
  CUresult r = kSuccess;
  for (const auto& s : all) {
    const CUresult e = s->drain();
    if (r == kSuccess) r = e;
  }
  return r;
}

// Work on a NULL-like stream: the legacy stream (NULL or 1, unless per_thread) waits for the
// blocking streams first; the per-thread stream (2, or NULL through a _ptsz entry point) does not.
void syncForNullStream(CUstream s, bool per_thread) noexcept {
  const auto h = reinterpret_cast<std::uintptr_t>(s);
  if (h == 2 || (h == 0 && per_thread)) return;
  drainStreams(true);
}

CUresult enqueue(const std::shared_ptr<Stream>& s, const Op& op) noexcept {
  try {
    std::lock_guard<std::mutex> lock(s->mu);
    s->queue.push_back(op);
    ++s->submitted;
  } catch (...) {
    return kOutOfMemory;
  }
  s->cv.notify_all();
  return kSuccess;
}

// The common path of every copy: dst/src are device or host (need_*: must be device).
CUresult copy(CUdeviceptr dst, CUdeviceptr src, std::size_t len, bool dst_device, bool src_device,
              bool async, CUstream stream, bool per_thread) noexcept {
  if (!g_initialized) return kNotInitialized;
  if (currentCtx() == 0) return kInvalidContext;
  std::shared_ptr<Stream> s;
  if (async && !isNullStream(stream)) {
    const CUresult r = findStream(stream, &s);
    if (r != kSuccess) return r;
  }
  if (const long e = g_copy_error.load()) return static_cast<CUresult>(e);
  if (len == 0) return kSuccess;
  Side d, c;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    CUresult r = resolve(dst, len, dst_device, &d);
    if (r == kSuccess) r = resolve(src, len, src_device, &c);
    if (r != kSuccess) return r;
  }
  if (!c.device && !hostReadable(c.p, len)) return kInvalidValue;
  if (!d.device && !hostReadable(d.p, len)) return kInvalidValue;
  if (s) {
    Op op;
    op.dst = d;
    op.src = c;
    op.len = len;
    const CUresult r = enqueue(s, op);
    if (r == kSuccess) g_async_copies.fetch_add(1);
    return r;
  }
  syncForNullStream(async ? stream : nullptr, per_thread);
  return execCopy(d, c, len);
}

CUresult memsetD8(CUdeviceptr dst, unsigned char value, std::size_t len, bool per_thread) noexcept {
  if (!g_initialized) return kNotInitialized;
  if (currentCtx() == 0) return kInvalidContext;
  if (const long e = g_copy_error.load()) return static_cast<CUresult>(e);
  if (len == 0) return kSuccess;
  Side d;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    const CUresult r = resolve(dst, len, true, &d);
    if (r != kSuccess) return r;
  }
  syncForNullStream(nullptr, per_thread);
  execMemset(d, value, len);
  return kSuccess;
}

CUresult streamSync(CUstream stream, bool per_thread) noexcept {
  if (!g_initialized) return kNotInitialized;
  if (currentCtx() == 0) return kInvalidContext;
  if (isNullStream(stream)) {
    const auto h = reinterpret_cast<std::uintptr_t>(stream);
    return h == 2 || (h == 0 && per_thread) ? kSuccess : drainStreams(true);
  }
  std::shared_ptr<Stream> s;
  const CUresult r = findStream(stream, &s);
  return r != kSuccess ? r : s->drain();
}

CUresult streamQuery(CUstream stream, bool per_thread) noexcept {
  if (!g_initialized) return kNotInitialized;
  if (currentCtx() == 0) return kInvalidContext;
  std::vector<std::shared_ptr<Stream>> check;
  try {
    if (isNullStream(stream)) {
      const auto h = reinterpret_cast<std::uintptr_t>(stream);
      if (h == 2 || (h == 0 && per_thread)) return kSuccess;
      std::lock_guard<std::mutex> lock(g_stream_mu);
      for (const auto& s : streams()) {
        if ((s.second->flags & 1u) == 0) check.push_back(s.second);
      }
    } else {
      std::shared_ptr<Stream> s;
      const CUresult r = findStream(stream, &s);
      if (r != kSuccess) return r;
      check.push_back(s);
    }
  } catch (...) {
    return kOutOfMemory;
  }
  for (const auto& s : check) {
    std::lock_guard<std::mutex> lock(s->mu);
    if (s->completed < s->submitted) return kNotReady;
    if (s->error != kSuccess) return s->error;
  }
  return kSuccess;
}

CUresult eventRecord(CUevent event, CUstream stream, bool per_thread) noexcept {
  if (!g_initialized) return kNotInitialized;
  if (currentCtx() == 0) return kInvalidContext;
  std::shared_ptr<Stream> s;
  if (!isNullStream(stream)) {
    const CUresult r = findStream(stream, &s);
    if (r != kSuccess) return r;
  } else {
    syncForNullStream(stream, per_thread);  // the legacy stream's position is reached at once
  }
  std::lock_guard<std::mutex> lock(g_stream_mu);
  auto it = events().find(event);
  if (it == events().end()) return kInvalidHandle;
  Event* e = it->second;
  e->target = 0;
  if (s) {
    std::lock_guard<std::mutex> slock(s->mu);
    e->target = s->submitted;
  }
  e->stream = std::move(s);
  return kSuccess;
}

CUresult streamWaitEvent(CUstream stream, CUevent event, unsigned flags) noexcept {
  if (!g_initialized) return kNotInitialized;
  if (currentCtx() == 0) return kInvalidContext;
  if ((flags & ~1u) != 0) return kInvalidValue;  // CU_EVENT_WAIT_DEFAULT, CU_EVENT_WAIT_EXTERNAL
  std::shared_ptr<Stream> s;
  if (!isNullStream(stream)) {
    const CUresult r = findStream(stream, &s);
    if (r != kSuccess) return r;
  }
  Op op;
  {
    std::lock_guard<std::mutex> lock(g_stream_mu);
    auto it = events().find(event);
    if (it == events().end()) return kInvalidHandle;
    op.wait_on = it->second->stream;
    op.wait_target = it->second->target;
  }
  if (!op.wait_on || op.wait_on == s) return kSuccess;  // complete, or a position of its own
  if (!s) {  // the NULL stream: the caller waits (synchronous-ish)
    op.wait_on->waitFor(op.wait_target);
    return kSuccess;
  }
  return enqueue(s, op);
}

CUresult eventState(CUevent event, bool wait) noexcept {
  if (!g_initialized) return kNotInitialized;
  std::shared_ptr<Stream> s;
  std::uint64_t target = 0;
  {
    std::lock_guard<std::mutex> lock(g_stream_mu);
    auto it = events().find(event);
    if (it == events().end()) return kInvalidHandle;
    s = it->second->stream;
    target = it->second->target;
  }
  if (!s) return kSuccess;
  if (wait) return s->waitFor(target);
  std::lock_guard<std::mutex> lock(s->mu);
  if (s->completed < target) return kNotReady;
  return s->error;
}

CUresult allocate(CUdeviceptr* out, std::size_t size, Kind kind) noexcept {
  if (out == nullptr || size == 0) return kInvalidValue;
  if (currentCtx() == 0 && g_initialized) return kInvalidContext;
  const int device = currentDevice();
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_initialized) return kNotInitialized;
  const std::uintptr_t va = takeVa(size);
  if (va == 0) return kOutOfMemory;
  Alloc a;
  a.size = size;
  a.id = g_next_id++;
  a.kind = kind;
  a.device = device;
  try {
    g_allocs[va] = a;
  } catch (...) {
    giveVa(va, size);
    return kOutOfMemory;
  }
  if (kind == Kind::kManaged && !g_cpu_access.load()) {
    mprotect(reinterpret_cast<void*>(va), roundUp(size), PROT_READ | PROT_WRITE);
  }
  *out = va;
  return kSuccess;
}

CUresult release(CUdeviceptr ptr) noexcept {
  drainStreams(false);  // a free waits for the device, as cuMemFree does
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_initialized) return kNotInitialized;
  auto it = g_allocs.find(ptr);
  if (it == g_allocs.end() || it->second.kind == Kind::kMapped) return kInvalidValue;
  if (it->second.kind == Kind::kManaged && !g_cpu_access.load()) {
    mprotect(reinterpret_cast<void*>(it->first), roundUp(it->second.size), PROT_NONE);
  }
  giveVa(it->first, it->second.size);
  g_allocs.erase(it);
  g_frees.fetch_add(1);
  return kSuccess;
}

// Caller holds g_mu: the handle's pages go (those a registration pinned stay with it).
void destroyHandle(std::map<CUhandle, Handle>::iterator h) noexcept {
  if (h->second.alias != nullptr) rawMunmap(h->second.alias, h->second.size);
  if (h->second.fd >= 0) close(h->second.fd);
  g_handles.erase(h);
}

long arenaBytes() noexcept {
  std::lock_guard<std::mutex> lock(g_mu);
  struct stat st;
  if (g_arena_fd < 0 || fstat(g_arena_fd, &st) != 0) return -1;
  return static_cast<long>(st.st_blocks) * 512;
}

}  // namespace

// ---- Entry points that UCX's libucm patches in place.
//
// libucm's CUDA module (libucm_cuda, UCX 1.15 on) looks the allocation and free entry points up
// with dlsym and, on x86-64, overwrites the first 5 bytes of each (12 bytes where its hook is more
// than 2 GiB away, or with UCX_BISTRO_FORCE_FAR_JUMP) with a jump to its hook. To keep calling the
// driver it first copies the whole instructions those bytes cover somewhere else, which it can
// only do for a few instruction forms: push of a register, mov %rsp,%rbp, mov of a 32-bit immediate
// into a register, sub of an immediate from %rsp (an 8-bit immediate only from UCX 1.18.1), and a
// few more. A compiler's prologue for these functions (with the stack protector's load from %fs,
// for one) is not among them, and one failed patch makes libucm refuse every memory-type event
// handler. So on x86-64 each of these entry points is a small stub of exactly such instructions,
// 14 bytes before anything else, that jumps to the C++ implementation (gmd_fake_impl_<name>,
// hidden):
//   push %rbp; mov %rsp,%rbp; mov $0,%eax; mov $0,%eax; pop %rbp; jmp gmd_fake_impl_<name>
// %eax is no argument register of these functions; the stack is as on entry when the jump is taken.
// The stub is what dlsym and cuGetProcAddress hand out, as a real driver's entry point is. Other
// architectures keep plain definitions.
//   Patched by libucm: cuMemAlloc(_v2), cuMemAllocPitch(_v2), cuMemAllocManaged, cuMemAllocAsync,
//   cuMemFree(_v2), cuMemFreeAsync, cuMemMap, cuMemUnmap (and, where the fake had them,
//   cuMemAllocFromPoolAsync, cuMemFreeHost(_v2), cuModuleGetGlobal_v2, cuLibraryGetGlobal).
#if defined(__x86_64__)
#define GMD_FAKE_IMPL(name) gmd_fake_impl_##name
#define GMD_FAKE_PATCHED __attribute__((visibility("hidden")))
// clang-format off
#define GMD_FAKE_PATCHABLE(name)                                        \
  asm(".pushsection .text\n"                                            \
      ".globl " #name "\n"                                              \
      ".type " #name ", @function\n"                                    \
      ".p2align 4\n"                                                    \
      #name ":\n"                                                       \
      ".byte 0x55\n"                         /* push %rbp */            \
      ".byte 0x48, 0x89, 0xe5\n"             /* mov %rsp, %rbp */       \
      ".byte 0xb8, 0x00, 0x00, 0x00, 0x00\n" /* mov $0, %eax */         \
      ".byte 0xb8, 0x00, 0x00, 0x00, 0x00\n" /* mov $0, %eax */         \
      ".byte 0x5d\n"                         /* pop %rbp */             \
      "jmp gmd_fake_impl_" #name "\n"                                   \
      ".size " #name ", . - " #name "\n"                                \
      ".popsection\n");
// clang-format on
#else
#define GMD_FAKE_IMPL(name) name
#define GMD_FAKE_PATCHED __attribute__((visibility("default")))
#define GMD_FAKE_PATCHABLE(name)
#endif

GMD_FAKE_PATCHABLE(cuMemAlloc)
GMD_FAKE_PATCHABLE(cuMemAlloc_v2)
GMD_FAKE_PATCHABLE(cuMemAllocPitch)
GMD_FAKE_PATCHABLE(cuMemAllocPitch_v2)
GMD_FAKE_PATCHABLE(cuMemAllocManaged)
GMD_FAKE_PATCHABLE(cuMemAllocAsync)
GMD_FAKE_PATCHABLE(cuMemFree)
GMD_FAKE_PATCHABLE(cuMemFree_v2)
GMD_FAKE_PATCHABLE(cuMemFreeAsync)
GMD_FAKE_PATCHABLE(cuMemMap)
GMD_FAKE_PATCHABLE(cuMemUnmap)

extern "C" {

// The entry points above (the stubs on x86-64), for cuGetProcAddress's table.
CUresult cuMemAlloc(unsigned int* ptr, unsigned int size) noexcept;
CUresult cuMemAlloc_v2(CUdeviceptr* ptr, std::size_t size) noexcept;
CUresult cuMemAllocPitch(unsigned* ptr, unsigned* pitch, unsigned width, unsigned height,
                         unsigned element) noexcept;
CUresult cuMemAllocPitch_v2(CUdeviceptr* ptr, std::size_t* pitch, std::size_t width,
                            std::size_t height, unsigned element) noexcept;
CUresult cuMemAllocManaged(CUdeviceptr* ptr, std::size_t size, unsigned int flags) noexcept;
CUresult cuMemAllocAsync(CUdeviceptr* ptr, std::size_t size, CUstream stream) noexcept;
CUresult cuMemFree(unsigned int ptr) noexcept;
CUresult cuMemFree_v2(CUdeviceptr ptr) noexcept;
CUresult cuMemFreeAsync(CUdeviceptr ptr, CUstream stream) noexcept;
CUresult cuMemMap(CUdeviceptr ptr, std::size_t size, std::size_t offset, CUhandle handle,
                  unsigned long long flags) noexcept;
CUresult cuMemUnmap(CUdeviceptr ptr, std::size_t size) noexcept;

__attribute__((visibility("default"))) int gmd_fake_cuda_driver = 1;

__attribute__((visibility("default"))) void gmd_fake_cuda_set(const char* key,
                                                              long value) noexcept {
  if (key == nullptr) return;
  if (std::strcmp(key, "devices") == 0) g_devices = value;
  if (std::strcmp(key, "current_device") == 0) g_current_device = value;
  if (std::strcmp(key, "dmabuf_supported") == 0) g_dmabuf_supported = value;
  if (std::strcmp(key, "dmabuf_pcie") == 0) g_dmabuf_pcie = value;
  if (std::strcmp(key, "dmabuf_fail") == 0) g_dmabuf_fail = value;
  if (std::strcmp(key, "copy_delay_us") == 0) g_copy_delay_us = value;
  if (std::strcmp(key, "copy_error") == 0) g_copy_error = value;
  if (std::strcmp(key, "reset_thread_context") == 0) t_ctx = CtxStack{};
  if (std::strcmp(key, "hold_streams") == 0) {
    g_hold_streams = value != 0;
    std::lock_guard<std::mutex> lock(g_stream_mu);
    for (const auto& s : streams()) {
      { std::lock_guard<std::mutex> slock(s.second->mu); }  // no worker between test and wait
      s.second->cv.notify_all();
    }
  }
}

__attribute__((visibility("default"))) long gmd_fake_cuda_get(const char* key) noexcept {
  if (key == nullptr) return -1;
  if (std::strcmp(key, "live_allocations") == 0) {
    std::lock_guard<std::mutex> lock(g_mu);
    return static_cast<long>(g_allocs.size());
  }
  if (std::strcmp(key, "pointer_queries") == 0) return g_pointer_queries.load();
  if (std::strcmp(key, "frees") == 0) return g_frees.load();
  if (std::strcmp(key, "last_dmabuf_fd") == 0) return g_last_dmabuf_fd.load();
  if (std::strcmp(key, "last_dmabuf_flags") == 0) return g_last_dmabuf_flags.load();
  if (std::strcmp(key, "dmabuf_exports") == 0) return g_dmabuf_exports.load();
  if (std::strcmp(key, "arena") == 0) return static_cast<long>(g_arena);
  if (std::strcmp(key, "handles") == 0) {
    std::lock_guard<std::mutex> lock(g_mu);
    return static_cast<long>(g_handles.size());
  }
  if (std::strcmp(key, "cpu_access") == 0) return g_cpu_access.load() ? 1 : 0;
  if (std::strcmp(key, "devices") == 0) return devices();
  if (std::strcmp(key, "host_registered") == 0) {
    std::lock_guard<std::mutex> lock(g_mu);
    return static_cast<long>(g_host_registered.size());
  }
  if (std::strcmp(key, "arena_bytes") == 0) return arenaBytes();
  static const char* const kDirections[] = {"htod", "dtoh", "dtod", "htoh"};
  for (int d = 0; d < 4; ++d) {
    if (std::strncmp(key, "copies_", 7) == 0 && std::strcmp(key + 7, kDirections[d]) == 0) {
      return g_copies[d].load();
    }
    if (std::strncmp(key, "bytes_", 6) == 0 && std::strcmp(key + 6, kDirections[d]) == 0) {
      return g_bytes[d].load();
    }
  }
  if (std::strcmp(key, "async_copies") == 0) return g_async_copies.load();
  if (std::strcmp(key, "memsets") == 0) return g_memsets.load();
  if (std::strcmp(key, "bytes_memset") == 0) return g_bytes_memset.load();
  if (std::strcmp(key, "sync_memops_set") == 0) return g_sync_memops_set.load();
  if (std::strcmp(key, "streams") == 0) return g_streams_live.load();
  if (std::strcmp(key, "events") == 0) return g_events_live.load();
  if (std::strcmp(key, "copy_delay_us") == 0) return g_copy_delay_us.load();
  return -1;
}

CUresult cuInit(unsigned flags) noexcept {
  if (flags != 0) return kInvalidValue;
  if (devices() <= 0) return kNoDevice;
  std::lock_guard<std::mutex> lock(g_mu);
  g_initialized = true;
  return ensureArena() ? kSuccess : kOutOfMemory;
}

CUresult cuDriverGetVersion(int* version) noexcept {
  if (version == nullptr) return kInvalidValue;
  *version = 12080;
  return kSuccess;
}

CUresult cuDeviceGetCount(int* count) noexcept {
  if (count == nullptr) return kInvalidValue;
  if (!g_initialized) return kNotInitialized;
  *count = static_cast<int>(devices());
  return kSuccess;
}

CUresult cuDeviceGet(int* device, int ordinal) noexcept {
  if (device == nullptr) return kInvalidValue;
  if (ordinal < 0 || ordinal >= devices()) return kInvalidDevice;
  *device = ordinal;
  return kSuccess;
}

CUresult cuDeviceGetAttribute(int* value, int attribute, int device) noexcept {
  if (value == nullptr) return kInvalidValue;
  if (device < 0 || device >= devices()) return kInvalidDevice;
  unsigned domain = 0, bus = 0, slot = 0, function = 0;
  const bool pci = pciAddress(device, &domain, &bus, &slot, &function);
  switch (attribute) {
    case 124:  // CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED
      *value = static_cast<int>(g_dmabuf_supported.load());
      break;
    case 33:  // CU_DEVICE_ATTRIBUTE_PCI_BUS_ID
      *value = pci ? static_cast<int>(bus) : 0;
      break;
    case 34:  // CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID
      *value = pci ? static_cast<int>(slot) : 0;
      break;
    case 50:  // CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID
      *value = pci ? static_cast<int>(domain) : 0;
      break;
    case 41:   // CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING
    case 83:   // CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY
    case 102:  // CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
    case 110:  // CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED
    case 115:  // CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED
      *value = 1;
      break;
    default:
      *value = 0;
  }
  return kSuccess;
}

CUresult cuDeviceGetPCIBusId(char* out, int len, int device) noexcept {
  if (out == nullptr || len <= 0) return kInvalidValue;
  if (device < 0 || device >= devices()) return kInvalidDevice;
  unsigned domain = 0, bus = 0, slot = 0, function = 0;
  if (!pciAddress(device, &domain, &bus, &slot, &function)) return kInvalidValue;
  std::snprintf(out, static_cast<std::size_t>(len), "%04x:%02x:%02x.%x", domain, bus, slot,
                function);
  return kSuccess;
}

// Contexts are tokens (device + 1): see the top comment.
CUresult cuDevicePrimaryCtxRetain(CUcontext* ctx, int device) noexcept {
  if (ctx == nullptr) return kInvalidValue;
  if (!g_initialized) return kNotInitialized;
  if (device < 0 || device >= devices()) return kInvalidDevice;
  *ctx = reinterpret_cast<CUcontext>(static_cast<std::uintptr_t>(device) + 1);
  return kSuccess;
}
CUresult cuDevicePrimaryCtxRelease_v2(int device) noexcept {
  return device >= 0 && device < devices() ? kSuccess : kInvalidDevice;
}
CUresult cuDevicePrimaryCtxRelease(int device) noexcept {
  return cuDevicePrimaryCtxRelease_v2(device);
}
CUresult cuCtxSetCurrent(CUcontext ctx) noexcept {
  const auto token = reinterpret_cast<std::uintptr_t>(ctx);
  if (token == 0) {  // pops the top, if any
    if (t_ctx.depth > 0) --t_ctx.depth;
    return kSuccess;
  }
  if (!validCtx(token)) return kInvalidContext;
  if (t_ctx.depth == 0) t_ctx.slots[t_ctx.depth++] = kFollow;
  std::uintptr_t& top = t_ctx.slots[t_ctx.depth - 1];
  if (top == kFollow) {
    g_current_device = static_cast<long>(token) - 1;
  } else {
    top = token;
  }
  return kSuccess;
}
CUresult cuCtxGetCurrent(CUcontext* ctx) noexcept {
  if (ctx == nullptr) return kInvalidValue;
  *ctx = reinterpret_cast<CUcontext>(currentCtx());
  return kSuccess;
}
CUresult cuCtxPushCurrent_v2(CUcontext ctx) noexcept {
  const auto token = reinterpret_cast<std::uintptr_t>(ctx);
  if (token == 0) return kInvalidValue;
  if (!validCtx(token)) return kInvalidContext;
  if (t_ctx.depth == kMaxCtxDepth) return kOutOfMemory;
  t_ctx.slots[t_ctx.depth++] = token;
  return kSuccess;
}
CUresult cuCtxPushCurrent(CUcontext ctx) noexcept { return cuCtxPushCurrent_v2(ctx); }
CUresult cuCtxPopCurrent_v2(CUcontext* ctx) noexcept {
  if (t_ctx.depth == 0) return kInvalidContext;
  const std::uintptr_t token = resolveCtx(t_ctx.slots[--t_ctx.depth]);
  if (ctx != nullptr) *ctx = reinterpret_cast<CUcontext>(token);
  return kSuccess;
}
CUresult cuCtxPopCurrent(CUcontext* ctx) noexcept { return cuCtxPopCurrent_v2(ctx); }
CUresult cuCtxGetDevice(int* device) noexcept {
  if (device == nullptr) return kInvalidValue;
  const std::uintptr_t c = currentCtx();
  if (c == 0) return kInvalidContext;
  *device = static_cast<int>(c - 1);
  return kSuccess;
}
CUresult cuCtxSynchronize() noexcept {
  if (currentCtx() == 0) return kInvalidContext;
  return drainStreams(false);
}

// ---- Streams and events.

CUresult cuStreamCreate(CUstream* stream, unsigned flags) noexcept {
  if (stream == nullptr || (flags & ~1u) != 0) return kInvalidValue;
  if (!g_initialized) return kNotInitialized;
  if (currentCtx() == 0) return kInvalidContext;
  try {
    auto s = std::make_shared<Stream>();
    s->flags = flags;
    s->device = currentDevice();
    Stream* raw = s.get();
    {
      std::lock_guard<std::mutex> lock(g_stream_mu);
      streams()[raw] = s;
    }
    try {
      raw->worker = std::thread([raw] { raw->run(); });
    } catch (...) {
      std::lock_guard<std::mutex> lock(g_stream_mu);
      streams().erase(raw);
      return kOutOfMemory;
    }
    g_streams_live.fetch_add(1);
    *stream = raw;
    return kSuccess;
  } catch (...) {
    return kOutOfMemory;
  }
}

CUresult cuStreamDestroy_v2(CUstream stream) noexcept {
  if (!g_initialized) return kNotInitialized;
  if (currentCtx() == 0) return kInvalidContext;
  std::shared_ptr<Stream> s;
  {
    std::lock_guard<std::mutex> lock(g_stream_mu);
    auto it = streams().find(stream);
    if (it == streams().end()) return kInvalidHandle;
    s = std::move(it->second);
    streams().erase(it);
  }
  {
    std::lock_guard<std::mutex> lock(s->mu);
    s->stop = true;
  }
  s->cv.notify_all();
  try {
    if (s->worker.joinable()) s->worker.join();  // the queued work completes first
  } catch (...) {
    s->worker.detach();
  }
  g_streams_live.fetch_sub(1);
  return kSuccess;
}
CUresult cuStreamDestroy(CUstream stream) noexcept { return cuStreamDestroy_v2(stream); }

CUresult cuStreamSynchronize(CUstream stream) noexcept { return streamSync(stream, false); }
CUresult cuStreamSynchronize_ptsz(CUstream stream) noexcept { return streamSync(stream, true); }
CUresult cuStreamQuery(CUstream stream) noexcept { return streamQuery(stream, false); }
CUresult cuStreamQuery_ptsz(CUstream stream) noexcept { return streamQuery(stream, true); }

CUresult cuEventCreate(CUevent* event, unsigned flags) noexcept {
  if (event == nullptr || (flags & ~7u) != 0) return kInvalidValue;
  if (!g_initialized) return kNotInitialized;
  if (currentCtx() == 0) return kInvalidContext;
  try {
    auto* e = new Event;
    e->flags = flags;
    {
      std::lock_guard<std::mutex> lock(g_stream_mu);
      try {
        events()[e] = e;
      } catch (...) {
        delete e;
        return kOutOfMemory;
      }
    }
    g_events_live.fetch_add(1);
    *event = e;
    return kSuccess;
  } catch (...) {
    return kOutOfMemory;
  }
}
CUresult cuEventRecord(CUevent event, CUstream stream) noexcept {
  return eventRecord(event, stream, false);
}
CUresult cuEventRecord_ptsz(CUevent event, CUstream stream) noexcept {
  return eventRecord(event, stream, true);
}
CUresult cuEventQuery(CUevent event) noexcept { return eventState(event, false); }
CUresult cuStreamWaitEvent(CUstream stream, CUevent event, unsigned flags) noexcept {
  return streamWaitEvent(stream, event, flags);
}
CUresult cuStreamWaitEvent_ptsz(CUstream stream, CUevent event, unsigned flags) noexcept {
  return streamWaitEvent(stream, event, flags);
}
CUresult cuEventSynchronize(CUevent event) noexcept {
  if (g_initialized && currentCtx() == 0) return kInvalidContext;
  return eventState(event, true);
}
CUresult cuEventDestroy_v2(CUevent event) noexcept {
  if (!g_initialized) return kNotInitialized;
  if (currentCtx() == 0) return kInvalidContext;
  Event* e = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_stream_mu);
    auto it = events().find(event);
    if (it == events().end()) return kInvalidHandle;
    e = it->second;
    events().erase(it);
  }
  delete e;
  g_events_live.fetch_sub(1);
  return kSuccess;
}
CUresult cuEventDestroy(CUevent event) noexcept { return cuEventDestroy_v2(event); }

// ---- Copies. v1 entry points take 32-bit device pointers and sizes (the arena is below 4 GiB).

CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, std::size_t n) noexcept {
  return copy(dst, src, n, false, false, false, nullptr, false);
}
CUresult cuMemcpy_ptds(CUdeviceptr dst, CUdeviceptr src, std::size_t n) noexcept {
  return copy(dst, src, n, false, false, false, nullptr, true);
}
CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, std::size_t n, CUstream s) noexcept {
  return copy(dst, src, n, false, false, true, s, false);
}
CUresult cuMemcpyAsync_ptsz(CUdeviceptr dst, CUdeviceptr src, std::size_t n, CUstream s) noexcept {
  return copy(dst, src, n, false, false, true, s, true);
}

CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void* src, std::size_t n) noexcept {
  return copy(dst, reinterpret_cast<CUdeviceptr>(src), n, true, false, false, nullptr, false);
}
CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr dst, const void* src, std::size_t n) noexcept {
  return copy(dst, reinterpret_cast<CUdeviceptr>(src), n, true, false, false, nullptr, true);
}
CUresult cuMemcpyHtoD(unsigned dst, const void* src, unsigned n) noexcept {
  return cuMemcpyHtoD_v2(dst, src, n);
}
CUresult cuMemcpyDtoH_v2(void* dst, CUdeviceptr src, std::size_t n) noexcept {
  return copy(reinterpret_cast<CUdeviceptr>(dst), src, n, false, true, false, nullptr, false);
}
CUresult cuMemcpyDtoH_v2_ptds(void* dst, CUdeviceptr src, std::size_t n) noexcept {
  return copy(reinterpret_cast<CUdeviceptr>(dst), src, n, false, true, false, nullptr, true);
}
CUresult cuMemcpyDtoH(void* dst, unsigned src, unsigned n) noexcept {
  return cuMemcpyDtoH_v2(dst, src, n);
}
CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, std::size_t n) noexcept {
  return copy(dst, src, n, true, true, false, nullptr, false);
}
CUresult cuMemcpyDtoD_v2_ptds(CUdeviceptr dst, CUdeviceptr src, std::size_t n) noexcept {
  return copy(dst, src, n, true, true, false, nullptr, true);
}
CUresult cuMemcpyDtoD(unsigned dst, unsigned src, unsigned n) noexcept {
  return cuMemcpyDtoD_v2(dst, src, n);
}

CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void* src, std::size_t n,
                              CUstream s) noexcept {
  return copy(dst, reinterpret_cast<CUdeviceptr>(src), n, true, false, true, s, false);
}
CUresult cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr dst, const void* src, std::size_t n,
                                   CUstream s) noexcept {
  return copy(dst, reinterpret_cast<CUdeviceptr>(src), n, true, false, true, s, true);
}
CUresult cuMemcpyHtoDAsync(unsigned dst, const void* src, unsigned n, CUstream s) noexcept {
  return cuMemcpyHtoDAsync_v2(dst, src, n, s);
}
CUresult cuMemcpyDtoHAsync_v2(void* dst, CUdeviceptr src, std::size_t n, CUstream s) noexcept {
  return copy(reinterpret_cast<CUdeviceptr>(dst), src, n, false, true, true, s, false);
}
CUresult cuMemcpyDtoHAsync_v2_ptsz(void* dst, CUdeviceptr src, std::size_t n, CUstream s) noexcept {
  return copy(reinterpret_cast<CUdeviceptr>(dst), src, n, false, true, true, s, true);
}
CUresult cuMemcpyDtoHAsync(void* dst, unsigned src, unsigned n, CUstream s) noexcept {
  return cuMemcpyDtoHAsync_v2(dst, src, n, s);
}
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, std::size_t n,
                              CUstream s) noexcept {
  return copy(dst, src, n, true, true, true, s, false);
}
CUresult cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr dst, CUdeviceptr src, std::size_t n,
                                   CUstream s) noexcept {
  return copy(dst, src, n, true, true, true, s, true);
}
CUresult cuMemcpyDtoDAsync(unsigned dst, unsigned src, unsigned n, CUstream s) noexcept {
  return cuMemcpyDtoDAsync_v2(dst, src, n, s);
}

CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char value, std::size_t n) noexcept {
  return memsetD8(dst, value, n, false);
}
CUresult cuMemsetD8_v2_ptds(CUdeviceptr dst, unsigned char value, std::size_t n) noexcept {
  return memsetD8(dst, value, n, true);
}
CUresult cuMemsetD8(unsigned dst, unsigned char value, unsigned n) noexcept {
  return memsetD8(dst, value, n, false);
}

// ---- Memory.

GMD_FAKE_PATCHED CUresult GMD_FAKE_IMPL(cuMemAlloc_v2)(CUdeviceptr* ptr,
                                                       std::size_t size) noexcept {
  return allocate(ptr, size, Kind::kDevice);
}

GMD_FAKE_PATCHED CUresult GMD_FAKE_IMPL(cuMemAlloc)(unsigned int* ptr, unsigned int size) noexcept {
  CUdeviceptr p = 0;
  if (ptr == nullptr) return kInvalidValue;
  CUresult r = allocate(&p, size, Kind::kDevice);
  if (r != kSuccess) return r;
  if (p > 0xffffffffu) {
    release(p);
    return kOutOfMemory;
  }
  *ptr = static_cast<unsigned int>(p);
  return kSuccess;
}

// Rows of WidthInBytes rounded up to 512 bytes; ElementSizeBytes 4, 8 or 16, as the driver wants.
GMD_FAKE_PATCHED CUresult GMD_FAKE_IMPL(cuMemAllocPitch_v2)(CUdeviceptr* ptr, std::size_t* pitch,
                                                            std::size_t width, std::size_t height,
                                                            unsigned element) noexcept {
  if (ptr == nullptr || pitch == nullptr || width == 0 || height == 0 ||
      (element != 4 && element != 8 && element != 16)) {
    return kInvalidValue;
  }
  const std::size_t p = (width + 511) & ~std::size_t{511};
  const CUresult r = allocate(ptr, p * height, Kind::kDevice);
  if (r == kSuccess) *pitch = p;
  return r;
}
GMD_FAKE_PATCHED CUresult GMD_FAKE_IMPL(cuMemAllocPitch)(unsigned* ptr, unsigned* pitch,
                                                         unsigned width, unsigned height,
                                                         unsigned element) noexcept {
  if (ptr == nullptr || pitch == nullptr) return kInvalidValue;
  CUdeviceptr p = 0;
  std::size_t row = 0;
  // The implementation, not the entry point: one allocation, one call a hook sees.
  const CUresult r = GMD_FAKE_IMPL(cuMemAllocPitch_v2)(&p, &row, width, height, element);
  if (r != kSuccess) return r;
  if (p > 0xffffffffu) {
    release(p);
    return kOutOfMemory;
  }
  *ptr = static_cast<unsigned>(p);
  *pitch = static_cast<unsigned>(row);
  return kSuccess;
}

GMD_FAKE_PATCHED CUresult GMD_FAKE_IMPL(cuMemFree_v2)(CUdeviceptr ptr) noexcept {
  return release(ptr);
}
GMD_FAKE_PATCHED CUresult GMD_FAKE_IMPL(cuMemFree)(unsigned int ptr) noexcept {
  return release(ptr);
}

GMD_FAKE_PATCHED CUresult GMD_FAKE_IMPL(cuMemAllocManaged)(CUdeviceptr* ptr, std::size_t size,
                                                           unsigned int) noexcept {
  return allocate(ptr, size, Kind::kManaged);
}

GMD_FAKE_PATCHED CUresult GMD_FAKE_IMPL(cuMemAllocAsync)(CUdeviceptr* ptr, std::size_t size,
                                                         CUstream) noexcept {
  return allocate(ptr, size, Kind::kDevice);
}
CUresult cuMemAllocAsync_ptsz(CUdeviceptr* ptr, std::size_t size, CUstream) noexcept {
  return allocate(ptr, size, Kind::kDevice);
}
GMD_FAKE_PATCHED CUresult GMD_FAKE_IMPL(cuMemFreeAsync)(CUdeviceptr ptr, CUstream) noexcept {
  return release(ptr);
}
CUresult cuMemFreeAsync_ptsz(CUdeviceptr ptr, CUstream) noexcept { return release(ptr); }

CUresult cuMemGetAllocationGranularity(std::size_t* granularity, const void*, int) noexcept {
  if (granularity == nullptr) return kInvalidValue;
  *granularity = kGranule;
  return kSuccess;
}

CUresult cuMemAddressReserve(CUdeviceptr* ptr, std::size_t size, std::size_t, CUdeviceptr,
                             unsigned long long) noexcept {
  if (ptr == nullptr || size == 0 || size % kGranule != 0) return kInvalidValue;
  std::lock_guard<std::mutex> lock(g_mu);
  const std::uintptr_t va = takeVa(size);
  if (va == 0) return kOutOfMemory;
  try {
    g_reserved[va] = size;
  } catch (...) {
    giveVa(va, size);
    return kOutOfMemory;
  }
  *ptr = va;
  return kSuccess;
}

CUresult cuMemAddressFree(CUdeviceptr ptr, std::size_t size) noexcept {
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_reserved.find(ptr);
  if (it == g_reserved.end() || it->second != size) return kInvalidValue;
  for (const auto& a : g_allocs) {
    if (a.first >= ptr && a.first < ptr + size) return kInvalidValue;  // still mapped
  }
  giveVa(ptr, size);
  g_reserved.erase(it);
  return kSuccess;
}

CUresult cuMemCreate(CUhandle* handle, std::size_t size, const void* prop,
                     unsigned long long) noexcept {
  if (handle == nullptr || size == 0 || size % kGranule != 0) return kInvalidValue;
  // CUmemAllocationProp starts {type, requestedHandleTypes, location {type, id}}: the device is
  // location.id, as on a real driver.
  const int device = prop != nullptr ? static_cast<const int*>(prop)[3] : currentDevice();
  if (device < 0 || device >= devices()) return kInvalidDevice;
  Handle h;
  h.size = size;
  h.device = device;
  h.requested_types = prop != nullptr ? static_cast<const int*>(prop)[1] : 0;
  h.fd = memfd_create("gmd-fake-cuda-vmm", MFD_CLOEXEC);
  if (h.fd < 0) return kOutOfMemory;
  void* alias = MAP_FAILED;
  if (ftruncate(h.fd, static_cast<off_t>(size)) == 0) {
    alias = rawMmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, h.fd, 0);
  }
  if (alias == MAP_FAILED) {
    close(h.fd);
    return kOutOfMemory;
  }
  h.alias = static_cast<char*>(alias);
  std::lock_guard<std::mutex> lock(g_mu);
  try {
    g_handles[g_next_handle] = h;
  } catch (...) {
    rawMunmap(alias, size);
    close(h.fd);
    return kOutOfMemory;
  }
  *handle = g_next_handle++;
  return kSuccess;
}

GMD_FAKE_PATCHED CUresult GMD_FAKE_IMPL(cuMemMap)(CUdeviceptr ptr, std::size_t size,
                                                  std::size_t offset, CUhandle handle,
                                                  unsigned long long) noexcept {
  std::lock_guard<std::mutex> lock(g_mu);
  auto h = g_handles.find(handle);
  if (h == g_handles.end() || h->second.released || size == 0 || size % kGranule != 0 ||
      offset % kGranule != 0 || offset + size > h->second.size) {
    return kInvalidValue;
  }
  auto r = g_reserved.upper_bound(ptr);
  if (r == g_reserved.begin()) return kInvalidValue;
  --r;
  if (ptr + size > r->first + r->second) return kInvalidValue;
  auto next = g_allocs.lower_bound(ptr);
  if (findAlloc(ptr) != g_allocs.end() || (next != g_allocs.end() && next->first < ptr + size)) {
    return kInvalidValue;  // overlaps a mapping
  }
  Alloc a;
  a.size = size;
  a.id = g_next_id++;
  a.kind = Kind::kMapped;
  a.handle = handle;
  a.offset = offset;
  a.device = h->second.device;
  try {
    g_allocs[ptr] = a;
  } catch (...) {
    return kOutOfMemory;
  }
  if (rawMmap(reinterpret_cast<void*>(ptr), size, devicePerm(), MAP_SHARED | MAP_FIXED,
              h->second.fd, static_cast<off_t>(offset)) == MAP_FAILED) {
    g_allocs.erase(ptr);
    return kOutOfMemory;
  }
  ++h->second.mappings;
  return kSuccess;
}

CUresult cuMemSetAccess(CUdeviceptr, std::size_t, const void*, std::size_t) noexcept {
  return kSuccess;
}

GMD_FAKE_PATCHED CUresult GMD_FAKE_IMPL(cuMemUnmap)(CUdeviceptr ptr, std::size_t size) noexcept {
  drainStreams(false);
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_allocs.find(ptr);
  if (it == g_allocs.end() || it->second.kind != Kind::kMapped || it->second.size != size) {
    return kInvalidValue;
  }
  // The reserved range shows the (hole) arena again; the handle's pages stay the handle's.
  rawMmap(reinterpret_cast<void*>(ptr), size, devicePerm(), MAP_SHARED | MAP_FIXED, g_arena_fd,
          static_cast<off_t>(ptr - g_arena));
  auto h = g_handles.find(it->second.handle);
  g_allocs.erase(it);
  g_frees.fetch_add(1);
  if (h != g_handles.end() && --h->second.mappings == 0 && h->second.released) destroyHandle(h);
  return kSuccess;
}

CUresult cuMemRelease(CUhandle handle) noexcept {
  drainStreams(false);
  std::lock_guard<std::mutex> lock(g_mu);
  auto h = g_handles.find(handle);
  if (h == g_handles.end() || h->second.released) return kInvalidValue;
  if (h->second.retains > 0) {  // one reference of cuMemRetainAllocationHandle's goes
    --h->second.retains;
    return kSuccess;
  }
  h->second.released = true;
  if (h->second.mappings == 0) destroyHandle(h);
  return kSuccess;
}

CUresult cuMemGetAddressRange_v2(CUdeviceptr* base, std::size_t* size, CUdeviceptr ptr) noexcept {
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = findAlloc(ptr);
  if (it == g_allocs.end()) return kNotFound;
  if (base != nullptr) *base = it->first;
  if (size != nullptr) *size = it->second.size;
  return kSuccess;
}

// ---- Pointer attributes.

CUresult cuPointerGetAttributes(unsigned count, int* attributes, void** data,
                                CUdeviceptr ptr) noexcept {
  if (attributes == nullptr || data == nullptr) return kInvalidValue;
  g_pointer_queries.fetch_add(1);
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = findAlloc(ptr);
  const bool found = it != g_allocs.end();
  const bool registered = !found && hostRegistered(ptr);
  for (unsigned i = 0; i < count; ++i) {
    void* d = data[i];
    if (d == nullptr) return kInvalidValue;
    switch (attributes[i]) {
      case kAttrContext:  // the primary context of the allocation's device; NULL for host memory
        *static_cast<CUcontext*>(d) =
            found ? reinterpret_cast<CUcontext>(static_cast<std::uintptr_t>(it->second.device) + 1)
                  : nullptr;
        break;
      case 2:  // MEMORY_TYPE: CU_MEMORYTYPE_DEVICE for device, mapped and managed; _HOST for
               // host memory registered with cuMemHostRegister
        *static_cast<unsigned*>(d) = found ? 2u : registered ? 1u : 0u;
        break;
      case kAttrSyncMemops:  // a boolean
        *static_cast<bool*>(d) = found && it->second.sync_memops;
        break;
      case 7:  // BUFFER_ID
        *static_cast<unsigned long long*>(d) = found ? it->second.id : 0;
        break;
      case 8:  // IS_MANAGED
        *static_cast<unsigned*>(d) = found && it->second.kind == Kind::kManaged ? 1u : 0u;
        break;
      case 9:  // DEVICE_ORDINAL
        *static_cast<int*>(d) = found ? it->second.device : -2;
        break;
      case 11:  // RANGE_START_ADDR
        *static_cast<CUdeviceptr*>(d) = found ? it->first : 0;
        break;
      case 12:  // RANGE_SIZE
        *static_cast<std::size_t*>(d) = found ? it->second.size : 0;
        break;
      case 13:  // MAPPED
        *static_cast<unsigned*>(d) = found ? 1u : 0u;
        break;
      default:
        return kInvalidValue;
    }
  }
  return kSuccess;
}

CUresult cuPointerGetAttribute(void* data, int attribute, CUdeviceptr ptr) noexcept {
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (findAlloc(ptr) == g_allocs.end() && !hostRegistered(ptr)) {
      return kInvalidValue;  // not a CUDA pointer
    }
  }
  void* d[] = {data};
  return cuPointerGetAttributes(1, &attribute, d, ptr);
}

// Only SYNC_MEMOPS can be set (value: an unsigned int, 0 or 1), on a live allocation.
CUresult cuPointerSetAttribute(const void* value, int attribute, CUdeviceptr ptr) noexcept {
  if (value == nullptr || attribute != kAttrSyncMemops) return kInvalidValue;
  if (!g_initialized) return kNotInitialized;
  if (currentCtx() == 0) return kInvalidContext;
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = findAlloc(ptr);
  if (it == g_allocs.end()) return kInvalidValue;
  it->second.sync_memops = *static_cast<const unsigned*>(value) != 0;
  g_sync_memops_set.fetch_add(1);
  return kSuccess;
}

CUresult cuMemGetHandleForAddressRange(void* handle, CUdeviceptr ptr, std::size_t size, int type,
                                       unsigned long long flags) noexcept {
  if (handle == nullptr || type != 1 /* CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD */)
    return kInvalidValue;
  if (!g_dmabuf_supported.load()) return kNotSupported;
  if ((flags & 1u) && !g_dmabuf_pcie.load()) return kInvalidValue;
  if (g_dmabuf_fail.load()) return kNotSupported;
  const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  if (ptr % page != 0 || size % page != 0 || size == 0) return kInvalidValue;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = findAlloc(ptr);
    if (it == g_allocs.end() || it->second.kind == Kind::kManaged ||
        ptr + size > it->first + roundUp(it->second.size)) {
      return kInvalidValue;
    }
  }
  const int fd = memfd_create("gmd-fake-dmabuf", MFD_CLOEXEC);
  if (fd < 0) return kOutOfMemory;
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
    close(fd);
    return kOutOfMemory;
  }
  *static_cast<int*>(handle) = fd;
  g_last_dmabuf_fd = fd;
  g_last_dmabuf_flags = static_cast<long>(flags);
  g_dmabuf_exports.fetch_add(1);
  return kSuccess;
}

// ---- What UCX's CUDA transports (libuct_cuda: cuda_copy, cuda_ipc) call besides the above.

CUresult cuDeviceGetName(char* name, int len, int device) noexcept {
  if (name == nullptr || len <= 0) return kInvalidValue;
  if (device < 0 || device >= devices()) return kInvalidDevice;
  std::snprintf(name, static_cast<std::size_t>(len), "gmd fake GPU %d", device);
  return kSuccess;
}

// The arena's size: every device's allocations come from it.
CUresult cuDeviceTotalMem_v2(std::size_t* bytes, int device) noexcept {
  if (bytes == nullptr) return kInvalidValue;
  if (device < 0 || device >= devices()) return kInvalidDevice;
  *bytes = kArenaSize;
  return kSuccess;
}

// 16 bytes, distinct per device and the same in every process (as a GPU's UUID is).
CUresult cuDeviceGetUuid(void* uuid, int device) noexcept {
  if (uuid == nullptr) return kInvalidValue;
  if (device < 0 || device >= devices()) return kInvalidDevice;
  unsigned char bytes[16] = {'g', 'm', 'd', '-', 'f', 'a', 'k', 'e', '-', 'g', 'p', 'u'};
  bytes[15] = static_cast<unsigned char>(device);
  std::memcpy(uuid, bytes, sizeof(bytes));
  return kSuccess;
}
CUresult cuDeviceGetUuid_v2(void* uuid, int device) noexcept {
  return cuDeviceGetUuid(uuid, device);
}

// The fake's results: each with the driver's name and description.
struct ErrorText {
  CUresult code;
  const char* name;
  const char* text;
};
constexpr ErrorText kErrorTexts[] = {
    {kSuccess, "CUDA_SUCCESS", "no error"},
    {kInvalidValue, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {kOutOfMemory, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {kNotInitialized, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {kNoDevice, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {kInvalidDevice, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {kInvalidContext, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {kInvalidHandle, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {kNotFound, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {kNotReady, "CUDA_ERROR_NOT_READY", "device not ready"},
    {kIllegalAddress, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"},
    {kHostAlreadyRegistered, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
     "part or all of the requested memory range is already mapped"},
    {kHostNotRegistered, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED",
     "pointer does not correspond to a registered memory region"},
    {kNotSupported, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
};

// *str = the name (or the description) of `error`; CUDA_ERROR_INVALID_VALUE for a code the fake
// never returns, as the driver does for an unknown one.
static CUresult errorText(CUresult error, bool name, const char** str) noexcept {
  if (str == nullptr) return kInvalidValue;
  for (const ErrorText& e : kErrorTexts) {
    if (e.code == error) {
      *str = name ? e.name : e.text;
      return kSuccess;
    }
  }
  *str = nullptr;
  return kInvalidValue;
}

CUresult cuGetErrorString(CUresult error, const char** str) noexcept {
  return errorText(error, /*name=*/false, str);
}

CUresult cuGetErrorName(CUresult error, const char** str) noexcept {
  return errorText(error, /*name=*/true, str);
}

// ctx NULL: the current one. The version of contexts made by the _v2 API.
CUresult cuCtxGetApiVersion(CUcontext ctx, unsigned* version) noexcept {
  if (version == nullptr) return kInvalidValue;
  const auto token = ctx != nullptr ? reinterpret_cast<std::uintptr_t>(ctx) : currentCtx();
  if (!validCtx(token)) return kInvalidContext;
  *version = 3020;
  return kSuccess;
}

CUresult cuCtxGetId(CUcontext ctx, unsigned long long* id) noexcept {
  if (id == nullptr) return kInvalidValue;
  const auto token = ctx != nullptr ? reinterpret_cast<std::uintptr_t>(ctx) : currentCtx();
  if (!validCtx(token)) return kInvalidContext;
  *id = token;
  return kSuccess;
}

// A device's primary context always exists and is active (contexts are tokens).
CUresult cuDevicePrimaryCtxGetState(int device, unsigned* flags, int* active) noexcept {
  if (flags == nullptr || active == nullptr) return kInvalidValue;
  if (!g_initialized) return kNotInitialized;
  if (device < 0 || device >= devices()) return kInvalidDevice;
  *flags = 0;
  *active = 1;
  return kSuccess;
}

// Page-locking is what a real driver does; the fake only remembers the range (the pointer
// attributes then answer host memory for it), and refuses overlaps and device memory as the driver
// does.
CUresult cuMemHostRegister_v2(void* p, std::size_t size, unsigned) noexcept {
  if (p == nullptr || size == 0) return kInvalidValue;
  if (!g_initialized) return kNotInitialized;
  const auto start = reinterpret_cast<std::uintptr_t>(p);
  if (!hostReadable(static_cast<const char*>(p), size)) return kInvalidValue;
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_arena != 0 && start < g_arena + kArenaSize && start + size > g_arena) return kInvalidValue;
  auto next = g_host_registered.lower_bound(start);
  if (hostRegistered(start) || (next != g_host_registered.end() && next->first < start + size)) {
    return kHostAlreadyRegistered;
  }
  try {
    g_host_registered[start] = size;
  } catch (...) {
    return kOutOfMemory;
  }
  return kSuccess;
}
CUresult cuMemHostRegister(void* p, std::size_t size, unsigned flags) noexcept {
  return cuMemHostRegister_v2(p, size, flags);
}

CUresult cuMemHostUnregister(void* p) noexcept {
  if (!g_initialized) return kNotInitialized;
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_host_registered.find(reinterpret_cast<std::uintptr_t>(p));
  if (it == g_host_registered.end()) return kHostNotRegistered;
  g_host_registered.erase(it);
  return kSuccess;
}

// Managed memory only: no advice was ever given (no preferred or last prefetch location, not read
// mostly, nobody named in ACCESSED_BY).
CUresult cuMemRangeGetAttribute(void* data, std::size_t data_size, int attribute, CUdeviceptr ptr,
                                std::size_t count) noexcept {
  if (data == nullptr || count == 0) return kInvalidValue;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = findAlloc(ptr);
    if (it == g_allocs.end() || it->second.kind != Kind::kManaged ||
        ptr + count > it->first + it->second.size) {
      return kInvalidValue;
    }
  }
  switch (attribute) {
    case 1:  // CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY
      if (data_size != sizeof(int)) return kInvalidValue;
      *static_cast<int*>(data) = 0;
      return kSuccess;
    case 2:  // PREFERRED_LOCATION
    case 4:  // LAST_PREFETCH_LOCATION
      if (data_size != sizeof(int)) return kInvalidValue;
      *static_cast<int*>(data) = -2;  // CU_DEVICE_INVALID
      return kSuccess;
    case 3:  // ACCESSED_BY: an array of devices, CU_DEVICE_INVALID past the last
      if (data_size == 0 || data_size % sizeof(int) != 0) return kInvalidValue;
      for (std::size_t i = 0; i < data_size / sizeof(int); ++i) static_cast<int*>(data)[i] = -2;
      return kSuccess;
    default:
      return kInvalidValue;
  }
}

// The callback runs once the stream's work queued before it completed: on the stream's worker, or
// for the NULL stream on a thread of its own after the blocking streams drained (never inside
// this call).
CUresult cuStreamAddCallback(CUstream stream, void (*callback)(CUstream, CUresult, void*),
                             void* user_data, unsigned flags) noexcept {
  if (callback == nullptr || flags != 0) return kInvalidValue;
  if (!g_initialized) return kNotInitialized;
  if (currentCtx() == 0) return kInvalidContext;
  if (isNullStream(stream)) {
    syncForNullStream(stream, false);
    try {
      std::thread([stream, callback, user_data] {
        callback(stream, kSuccess, user_data);
      }).detach();
    } catch (...) {
      return kOutOfMemory;
    }
    return kSuccess;
  }
  std::shared_ptr<Stream> s;
  const CUresult r = findStream(stream, &s);
  if (r != kSuccess) return r;
  Op op;
  op.callback = callback;
  op.user_data = user_data;
  return enqueue(s, op);
}

// VMM: the handle behind a mapped address (one more reference, dropped by cuMemRelease).
CUresult cuMemRetainAllocationHandle(CUhandle* handle, void* address) noexcept {
  if (handle == nullptr) return kInvalidValue;
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = findAlloc(reinterpret_cast<CUdeviceptr>(address));
  if (it == g_allocs.end() || it->second.kind != Kind::kMapped) return kInvalidValue;
  auto h = g_handles.find(it->second.handle);
  if (h == g_handles.end()) return kInvalidValue;
  ++h->second.retains;
  *handle = h->first;
  return kSuccess;
}

// CUmemAllocationProp (32 bytes): type PINNED, the requested handle types, location {DEVICE, the
// handle's device}, the rest zero.
CUresult cuMemGetAllocationPropertiesFromHandle(void* prop, CUhandle handle) noexcept {
  if (prop == nullptr) return kInvalidValue;
  std::lock_guard<std::mutex> lock(g_mu);
  auto h = g_handles.find(handle);
  if (h == g_handles.end() || h->second.released) return kInvalidValue;
  int head[4] = {1, h->second.requested_types, 1, h->second.device};
  std::memset(prop, 0, 32);
  std::memcpy(prop, head, sizeof(head));
  return kSuccess;
}

// Legacy IPC: a handle names the allocation (process, base, buffer ID). Another process's arena is
// out of the fake's reach, and a process cannot open its own handles (as on a real driver): opening
// fails either way, so UCX's cuda_ipc is never reachable between processes here.
struct IpcHandle {
  char reserved[64];
};
CUresult cuIpcGetMemHandle(IpcHandle* handle, CUdeviceptr ptr) noexcept {
  if (handle == nullptr) return kInvalidValue;
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = findAlloc(ptr);
  if (it == g_allocs.end() || it->second.kind != Kind::kDevice) return kInvalidValue;
  const std::uint64_t fields[4] = {0x676d642d69706300ull /* "gmd-ipc" */,
                                   static_cast<std::uint64_t>(getpid()), it->first, it->second.id};
  std::memset(handle, 0, sizeof(*handle));
  std::memcpy(handle->reserved, fields, sizeof(fields));
  return kSuccess;
}
CUresult cuIpcOpenMemHandle_v2(CUdeviceptr* ptr, IpcHandle handle, unsigned) noexcept {
  if (ptr == nullptr) return kInvalidValue;
  std::uint64_t fields[2] = {};
  std::memcpy(fields, handle.reserved, sizeof(fields));
  if (fields[0] != 0x676d642d69706300ull) return kInvalidValue;
  return fields[1] == static_cast<std::uint64_t>(getpid()) ? kInvalidContext : kNotSupported;
}
CUresult cuIpcCloseMemHandle(CUdeviceptr) noexcept { return kInvalidValue; }  // none is open

// Shareable VMM handles and memory pools: not supported by the fake.
CUresult cuMemExportToShareableHandle(void*, CUhandle, int, unsigned long long) noexcept {
  return kNotSupported;
}
CUresult cuMemImportFromShareableHandle(CUhandle*, void*, int) noexcept { return kNotSupported; }
CUresult cuMemPoolDestroy(void*) noexcept { return kNotSupported; }
CUresult cuMemPoolExportPointer(void*, CUdeviceptr) noexcept { return kNotSupported; }
CUresult cuMemPoolExportToShareableHandle(void*, void*, int, unsigned long long) noexcept {
  return kNotSupported;
}
CUresult cuMemPoolImportFromShareableHandle(void**, void*, int, unsigned long long) noexcept {
  return kNotSupported;
}
CUresult cuMemPoolImportPointer(CUdeviceptr*, void*, void*) noexcept { return kNotSupported; }
CUresult cuMemPoolSetAccess(void*, const void*, std::size_t) noexcept { return kNotSupported; }

// ---- cuGetProcAddress.

CUresult cuGetProcAddress_v2(const char* symbol, void** fn, int version, std::uint64_t flags,
                             int* status) noexcept;

CUresult cuGetProcAddress(const char* symbol, void** fn, int version,
                          std::uint64_t flags) noexcept {
  int status = 0;
  return cuGetProcAddress_v2(symbol, fn, version, flags, &status);
}

CUresult cuGetProcAddress_v2(const char* symbol, void** fn, int version, std::uint64_t flags,
                             int* status) noexcept {
  if (symbol == nullptr || fn == nullptr) return kInvalidValue;
  const bool ptsz = (flags & 2u) != 0;  // CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
  // The implementation a base name has from `since` (the CUDA version of its _v2), and its
  // per-thread default stream variant (nullptr: the same).
  struct Entry {
    const char* name;
    void* fn;
    void* v2 = nullptr;
    int since = 0;
    void* per_thread = nullptr;
  };
  auto f = [](auto* p) { return reinterpret_cast<void*>(p); };
  const Entry table[] = {
      {"cuInit", f(&cuInit)},
      {"cuDriverGetVersion", f(&cuDriverGetVersion)},
      {"cuDeviceGetCount", f(&cuDeviceGetCount)},
      {"cuDeviceGet", f(&cuDeviceGet)},
      {"cuDeviceGetAttribute", f(&cuDeviceGetAttribute)},
      {"cuDeviceGetPCIBusId", f(&cuDeviceGetPCIBusId)},
      {"cuDevicePrimaryCtxRetain", f(&cuDevicePrimaryCtxRetain)},
      {"cuDevicePrimaryCtxRelease", f(&cuDevicePrimaryCtxRelease), f(&cuDevicePrimaryCtxRelease_v2),
       11000},
      {"cuCtxSetCurrent", f(&cuCtxSetCurrent)},
      {"cuCtxGetCurrent", f(&cuCtxGetCurrent)},
      {"cuCtxPushCurrent", f(&cuCtxPushCurrent), f(&cuCtxPushCurrent_v2), 4000},
      {"cuCtxPopCurrent", f(&cuCtxPopCurrent), f(&cuCtxPopCurrent_v2), 4000},
      {"cuCtxGetDevice", f(&cuCtxGetDevice)},
      {"cuCtxSynchronize", f(&cuCtxSynchronize)},
      {"cuStreamCreate", f(&cuStreamCreate)},
      {"cuStreamDestroy", f(&cuStreamDestroy), f(&cuStreamDestroy_v2), 4000},
      {"cuStreamSynchronize", f(&cuStreamSynchronize), nullptr, 0, f(&cuStreamSynchronize_ptsz)},
      {"cuStreamQuery", f(&cuStreamQuery), nullptr, 0, f(&cuStreamQuery_ptsz)},
      {"cuEventCreate", f(&cuEventCreate)},
      {"cuEventRecord", f(&cuEventRecord), nullptr, 0, f(&cuEventRecord_ptsz)},
      {"cuEventQuery", f(&cuEventQuery)},
      {"cuStreamWaitEvent", f(&cuStreamWaitEvent), nullptr, 0, f(&cuStreamWaitEvent_ptsz)},
      {"cuEventSynchronize", f(&cuEventSynchronize)},
      {"cuEventDestroy", f(&cuEventDestroy), f(&cuEventDestroy_v2), 4000},
      {"cuMemcpy", f(&cuMemcpy), nullptr, 0, f(&cuMemcpy_ptds)},
      {"cuMemcpyAsync", f(&cuMemcpyAsync), nullptr, 0, f(&cuMemcpyAsync_ptsz)},
      {"cuMemcpyHtoD", f(&cuMemcpyHtoD), f(&cuMemcpyHtoD_v2), 3020, f(&cuMemcpyHtoD_v2_ptds)},
      {"cuMemcpyDtoH", f(&cuMemcpyDtoH), f(&cuMemcpyDtoH_v2), 3020, f(&cuMemcpyDtoH_v2_ptds)},
      {"cuMemcpyDtoD", f(&cuMemcpyDtoD), f(&cuMemcpyDtoD_v2), 3020, f(&cuMemcpyDtoD_v2_ptds)},
      {"cuMemcpyHtoDAsync", f(&cuMemcpyHtoDAsync), f(&cuMemcpyHtoDAsync_v2), 3020,
       f(&cuMemcpyHtoDAsync_v2_ptsz)},
      {"cuMemcpyDtoHAsync", f(&cuMemcpyDtoHAsync), f(&cuMemcpyDtoHAsync_v2), 3020,
       f(&cuMemcpyDtoHAsync_v2_ptsz)},
      {"cuMemcpyDtoDAsync", f(&cuMemcpyDtoDAsync), f(&cuMemcpyDtoDAsync_v2), 3020,
       f(&cuMemcpyDtoDAsync_v2_ptsz)},
      {"cuMemsetD8", f(&cuMemsetD8), f(&cuMemsetD8_v2), 3020, f(&cuMemsetD8_v2_ptds)},
      {"cuMemAlloc", f(&cuMemAlloc), f(&cuMemAlloc_v2), 3020},
      {"cuMemFree", f(&cuMemFree), f(&cuMemFree_v2), 3020},
      {"cuMemAllocPitch", f(&cuMemAllocPitch), f(&cuMemAllocPitch_v2), 3020},
      {"cuMemAllocManaged", f(&cuMemAllocManaged)},
      {"cuMemAllocAsync", f(&cuMemAllocAsync), nullptr, 0, f(&cuMemAllocAsync_ptsz)},
      {"cuMemFreeAsync", f(&cuMemFreeAsync), nullptr, 0, f(&cuMemFreeAsync_ptsz)},
      {"cuMemAddressReserve", f(&cuMemAddressReserve)},
      {"cuMemAddressFree", f(&cuMemAddressFree)},
      {"cuMemCreate", f(&cuMemCreate)},
      {"cuMemMap", f(&cuMemMap)},
      {"cuMemUnmap", f(&cuMemUnmap)},
      {"cuMemRelease", f(&cuMemRelease)},
      {"cuMemSetAccess", f(&cuMemSetAccess)},
      {"cuMemGetAllocationGranularity", f(&cuMemGetAllocationGranularity)},
      {"cuMemGetAddressRange", f(&cuMemGetAddressRange_v2)},
      {"cuPointerGetAttribute", f(&cuPointerGetAttribute)},
      {"cuPointerGetAttributes", f(&cuPointerGetAttributes)},
      {"cuPointerSetAttribute", f(&cuPointerSetAttribute)},
      {"cuMemGetHandleForAddressRange", f(&cuMemGetHandleForAddressRange)},
      {"cuGetProcAddress", f(&cuGetProcAddress), f(&cuGetProcAddress_v2), 12000},
      {"cuDeviceGetName", f(&cuDeviceGetName)},
      {"cuDeviceTotalMem", f(&cuDeviceTotalMem_v2)},
      {"cuDeviceGetUuid", f(&cuDeviceGetUuid), f(&cuDeviceGetUuid_v2), 11040},
      {"cuGetErrorString", f(&cuGetErrorString)},
      {"cuGetErrorName", f(&cuGetErrorName)},
      {"cuCtxGetApiVersion", f(&cuCtxGetApiVersion)},
      {"cuCtxGetId", f(&cuCtxGetId)},
      {"cuDevicePrimaryCtxGetState", f(&cuDevicePrimaryCtxGetState)},
      {"cuMemHostRegister", f(&cuMemHostRegister), f(&cuMemHostRegister_v2), 6050},
      {"cuMemHostUnregister", f(&cuMemHostUnregister)},
      {"cuMemRangeGetAttribute", f(&cuMemRangeGetAttribute)},
      {"cuStreamAddCallback", f(&cuStreamAddCallback)},
      {"cuMemRetainAllocationHandle", f(&cuMemRetainAllocationHandle)},
      {"cuMemGetAllocationPropertiesFromHandle", f(&cuMemGetAllocationPropertiesFromHandle)},
      {"cuIpcGetMemHandle", f(&cuIpcGetMemHandle)},
      {"cuIpcOpenMemHandle", f(&cuIpcOpenMemHandle_v2)},
      {"cuIpcCloseMemHandle", f(&cuIpcCloseMemHandle)},
  };
  for (const Entry& e : table) {
    if (std::strcmp(e.name, symbol) == 0) {
      *fn = e.v2 != nullptr && version >= e.since ? e.v2 : e.fn;
      if (ptsz && e.per_thread != nullptr && (e.v2 == nullptr || version >= e.since)) {
        *fn = e.per_thread;
      }
      if (status != nullptr) *status = 0;  // CU_GET_PROC_ADDRESS_SUCCESS
      return kSuccess;
    }
  }
  *fn = nullptr;
  if (status != nullptr) *status = 1;  // CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND
  return kNotFound;
}

}  // extern "C"
