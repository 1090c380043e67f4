#include "md/md.h"

#include <ucs/debug/log_def.h>
#include <ucs/type/cpu_set.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <new>
#include <string>

#include "common/log.h"
#include "md/abi/edge.h"
#include "md/mapping.h"
#include "md/ucs_topology.h"
#include "md/ucm_events.h"
#include "memtype/memtype.h"
#include "rcache/ucm_monitor.h"

namespace gmd::md {
namespace {

memtype::Info classify(const void* address, std::size_t length) {
  return memtype::Classifier::instance().classify(address, length);
}

// CUDA frees reach every open MD's cache through this subscriber (hook-safe: invalidate only).
void onCudaFree(void* arg, std::uintptr_t start, std::size_t length) {
  static_cast<rcache::InvalidationSink*>(arg)->invalidate(reinterpret_cast<const void*>(start),
                                                          length);
}

// CPUs near the device, from sysfs; every CPU when the device does not say.
void localCpus(const std::string& device, ucs_cpu_set_t* set) {
  UCS_CPU_ZERO(set);
  std::ifstream in("/sys/class/infiniband/" + device + "/device/local_cpulist");
  std::string list;
  if (in && std::getline(in, list) && !list.empty()) {
    std::size_t pos = 0;
    bool any = false;
    while (pos < list.size()) {
      unsigned first = 0, last = 0;
      int consumed = 0;
      if (std::sscanf(list.c_str() + pos, "%u-%u%n", &first, &last, &consumed) == 2 ||
          (std::sscanf(list.c_str() + pos, "%u%n", &first, &consumed) == 1 && (last = first, true))) {
        for (unsigned c = first; c <= last && c < UCS_CPU_SETSIZE; ++c) {
          UCS_CPU_SET(c, set);
          any = true;
        }
        pos += static_cast<std::size_t>(consumed);
        if (pos < list.size() && list[pos] == ',') ++pos;
      } else {
        break;
      }
    }
    if (any) return;
  }
  for (unsigned c = 0; c < UCS_CPU_SETSIZE; ++c) UCS_CPU_SET(c, set);
}

void mdClose(uct_md_h md) { delete Md::from(md); }

// gmd's one log shim (common/log.h): every layer's lines reach UCX's logger, level for level.
void logToUcx(LogLevel level, const char* module, const char* message) noexcept {
  switch (level) {
    case LogLevel::kError:
      ucs_error("gmd %s: %s", module, message);
      break;
    case LogLevel::kWarn:
      ucs_warn("gmd %s: %s", module, message);
      break;
    case LogLevel::kInfo:
      ucs_info("gmd %s: %s", module, message);
      break;
    case LogLevel::kDebug:
      ucs_debug("gmd %s: %s", module, message);
      break;
  }
}

ucs_status_t mdQuery(uct_md_h uct_md, uct_md_attr_t* attr) {
  Md* md = Md::from(uct_md);
  std::memset(attr, 0, sizeof(*attr));
  attr->cap.flags =
      UCT_MD_FLAG_REG | UCT_MD_FLAG_NEED_MEMH | UCT_MD_FLAG_NEED_RKEY | UCT_MD_FLAG_INVALIDATE;
#if GMD_UCX_SINCE(14)
  // UCP then passes the dma-buf another MD (UCX's cuda_copy) exported for device memory, and gmd
  // registers it instead of exporting one of its own (md/gpudirect.h, DmabufOffer).
  if (md->takesDmabuf()) attr->cap.flags |= UCT_MD_FLAG_REG_DMABUF;
#endif
  attr->cap.max_alloc = 0;
  attr->cap.max_reg = md->deviceAttr().max_mr_size != 0 ? md->deviceAttr().max_mr_size : SIZE_MAX;
  attr->cap.reg_mem_types = regMemTypes(md->registrar());
  attr->cap.detect_mem_types = 0;
  if (memtype::Classifier::instance().cudaAvailable()) {
    attr->cap.detect_mem_types =
        UCS_BIT(UCS_MEMORY_TYPE_CUDA) | UCS_BIT(UCS_MEMORY_TYPE_CUDA_MANAGED);
  }
  attr->cap.alloc_mem_types = 0;
  attr->cap.access_mem_types = UCS_BIT(UCS_MEMORY_TYPE_HOST);
  // A hit costs a cache lookup; the per-byte part of a miss is amortised by the cache.
  attr->reg_cost.c = md->config().overhead;
  attr->reg_cost.m = 0;
  attr->rkey_packed_size = kPackedRkeySize;
  localCpus(md->name(), &attr->local_cpus);
  return UCS_OK;
}

ucs_status_t mdMemReg(uct_md_h md, void* address, size_t length, unsigned flags,
                      uct_mem_h* memh_p) {
  return Md::from(md)->registrar().reg(address, length, flags, memh_p);
}

ucs_status_t mdMemRegDmabuf(uct_md_h md, void* address, size_t length, unsigned flags, int fd,
                            size_t offset, uct_mem_h* memh_p) {
  if (fd < 0 || offset > reinterpret_cast<std::uintptr_t>(address)) {
    ucs_error("gmd: invalid dma-buf for %p+%zu (fd %d, offset %zu)", address, length, fd, offset);
    return UCS_ERR_INVALID_PARAM;
  }
  const DmabufOffer offer(fd, reinterpret_cast<std::uintptr_t>(address), offset);
  return Md::from(md)->registrar().reg(address, length, flags, memh_p);
}

ucs_status_t mdMemDereg(uct_md_h md, const ucx::DeregParams* params) {
  return Md::from(md)->registrar().dereg(params);
}

ucs_status_t mdMemQuery(uct_md_h, const void* address, size_t length, uct_md_mem_attr_t* attr) {
  const memtype::Info info = classify(address, length);
  if (attr->field_mask & UCT_MD_MEM_ATTR_FIELD_MEM_TYPE) attr->mem_type = toUcsMemType(info.type);
  const bool device = info.type != MemType::kHost && info.size != 0;
  // The GPU holding device memory; managed pages move between host and GPUs: no fixed place.
  const ucs_sys_device_t sys_dev = info.type == MemType::kCuda
                                       ? sysDevices().cudaDevice(info.device)
                                       : UCS_SYS_DEVICE_ID_UNKNOWN;
  if (attr->field_mask & UCT_MD_MEM_ATTR_FIELD_SYS_DEV) attr->sys_dev = sys_dev;
  // Where gmd feeds UCX's memtype cache, the answer goes into it (UCP asks only on a miss or an
  // unknown range).
  ucm_events::writeBack(address, length, info, sys_dev);
  if (attr->field_mask & UCT_MD_MEM_ATTR_FIELD_BASE_ADDRESS) {
    attr->base_address = device ? reinterpret_cast<void*>(info.base) : const_cast<void*>(address);
  }
  if (attr->field_mask & UCT_MD_MEM_ATTR_FIELD_ALLOC_LENGTH) {
    attr->alloc_length = device ? info.size : length;
  }
  return UCS_OK;
}

ucs_status_t mdMkeyPack(uct_md_h, uct_mem_h memh, void* buffer) {
  if (memh == nullptr || buffer == nullptr) return UCS_ERR_INVALID_PARAM;
  const auto* region = static_cast<const rcache::Region*>(memh);
  packRkey(region->registration().rkey, region->memType(), buffer);
  return UCS_OK;
}

std::uint8_t mdMemFlags(uct_md_h md, ucs_memory_type_t mem_type) {
  return memFlags(regMemTypes(Md::from(md)->registrar()), mem_type);
}

ucs_status_t mdDetectMemoryType(uct_md_h, const void* address, size_t length,
                                ucs_memory_type_t* mem_type_p) {
  *mem_type_p = toUcsMemType(classify(address, length).type);
  return UCS_OK;
}

// Device memory through GPUDirect, when a CUDA driver with devices is present and the device can
// do it; nullptr otherwise (then CUDA stays out of reg_mem_types).
std::unique_ptr<GpuDirectBackend> makeGpuDirect(const char* name, ibv_pd* pd,
                                                const MdConfig& config) {
  memtype::Classifier& classifier = memtype::Classifier::instance();
  classifier.setFreeMode(freeMode(config));  // process-wide: the classifier is shared by all MDs
  if (!classifier.cudaAvailable()) return nullptr;
  GpuDirectConfig gd;
  gd.dmabuf = dmabufPolicy(config);
  auto backend = std::make_unique<GpuDirectBackend>(pd, gd);
  if (!backend->cudaSupported()) {
    ucs_debug("gmd %s: no GPUDirect path (dma-buf or peer memory) for CUDA memory", name);
    return nullptr;
  }
  return backend;
}

}  // namespace

void useUcxLogger() noexcept { setLogHandler(logToUcx); }

std::uint64_t regMemTypes(const Registrar& registrar) noexcept {
  std::uint64_t types = UCS_BIT(UCS_MEMORY_TYPE_HOST);
  if (registrar.cudaRegistration()) types |= UCS_BIT(UCS_MEMORY_TYPE_CUDA);
  if (registrar.managedPolicy() == ManagedPolicy::kHostPages &&
      memtype::Classifier::instance().cudaAvailable()) {
    types |= UCS_BIT(UCS_MEMORY_TYPE_CUDA_MANAGED);
  }
  return types;
}

std::uint8_t memFlags(std::uint64_t reg_mem_types, ucs_memory_type_t type) noexcept {
  const bool known = static_cast<unsigned>(type) < static_cast<unsigned>(UCS_MEMORY_TYPE_LAST);
  return known && (reg_mem_types & UCS_BIT(type)) != 0 ? kMemFlagRegistrable : 0;
}

// The generation's ops table (md/abi/edge_md.cc) adapts UCX's slots to these.
const MdImpl& mdImpl() noexcept {
  static const MdImpl impl = {
      .close = mdClose,
      .query = mdQuery,
      .mem_reg = mdMemReg,
      .mem_dereg = mdMemDereg,
      .mem_query = mdMemQuery,
      .mkey_pack = mdMkeyPack,
      .detect_memory_type = mdDetectMemoryType,
      .mem_reg_dmabuf = mdMemRegDmabuf,
      .mem_flags = mdMemFlags,
  };
  return impl;
}

namespace {

ibv_context* openDevice(const char* name) {
  int count = 0;
  ibv_device** list = ibv_get_device_list(&count);
  if (list == nullptr) return nullptr;
  ibv_context* ctx = nullptr;
  for (int i = 0; i < count && ctx == nullptr; ++i) {
    if (std::strcmp(ibv_get_device_name(list[i]), name) == 0) ctx = ibv_open_device(list[i]);
  }
  ibv_free_device_list(list);
  return ctx;
}

}  // namespace

ucs_status_t Md::open(ucx::Component* component, const char* name, const MdConfig& config,
                      uct_md_h* md_p) noexcept {
  std::string error;
  if (ucs_status_t st = validate(config, &error); st != UCS_OK) {
    ucs_error("gmd %s: %s", name, error.c_str());
    return st;
  }
  std::unique_ptr<Md> md(new (std::nothrow) Md());
  if (!md) return UCS_ERR_NO_MEMORY;
  try {
    md->name_ = name;
    md->config_ = config;
    md->handle_.header.ops = mdOps();
    md->handle_.header.component = component;
    md->handle_.md = md.get();

    useUcxLogger();
    ucm_events::start(config.cuda_events != 0);  // usually done already when UCX listed the MDs
    md->ctx_ = openDevice(name);
    if (md->ctx_ == nullptr) {
      ucs_error("gmd: cannot open RDMA device %s: %s", name, std::strerror(errno));
      return UCS_ERR_NO_DEVICE;
    }
    if (ibv_query_device(md->ctx_, &md->dev_attr_) != 0) {
      ucs_error("gmd %s: ibv_query_device: %s", name, std::strerror(errno));
      return UCS_ERR_IO_ERROR;
    }
    if (ucs_status_t st = md->events_.init(md->ctx_, md->name_.c_str()); st != UCS_OK) return st;
    md->pd_ = ibv_alloc_pd(md->ctx_);
    if (md->pd_ == nullptr) {
      ucs_error("gmd %s: ibv_alloc_pd: %s", name, std::strerror(errno));
      return UCS_ERR_NO_RESOURCE;
    }

    std::unique_ptr<rcache::Cache> cache;
    if (rcache::Status st = rcache::Cache::create(cacheConfig(config), &cache);
        st != rcache::Status::kOk) {
      ucs_error("gmd %s: cannot create the registration cache: %s", name,
                rcache::statusString(st));
      return toUcsStatus(st);
    }
    md->host_backend_ = std::make_unique<VerbsBackend>(md->pd_);
    md->cuda_backend_ = makeGpuDirect(name, md->pd_, config);
    md->registrar_ = std::make_unique<Registrar>(name, std::move(cache), md->host_backend_.get(),
                                                 md->cuda_backend_.get(), classify);
    md->registrar_->setValidateDeviceHits(freeMode(config) == memtype::FreeMode::kValidate ||
                                          freeMode(config) == memtype::FreeMode::kHooksAndValidate);
    md->registrar_->setManagedPolicy(managedPolicy(config));

    md->cpu_monitor_ = std::make_unique<rcache::UcmMonitor>(static_cast<int>(config.event_prio));
    if (rcache::Status st = md->cpu_monitor_->subscribe(&md->registrar_->cache());
        st != rcache::Status::kOk) {
      ucs_error("gmd %s: cannot subscribe to libucm memory events: %s", name,
                rcache::statusString(st));
      return toUcsStatus(st);
    }
    md->cpu_subscribed_ = true;
    if (memtype::Classifier::instance().cudaAvailable()) {
      if (!memtype::Classifier::instance().subscribe(onCudaFree, &md->registrar_->cache())) {
        ucs_error("gmd %s: cannot subscribe to CUDA frees", name);
        return UCS_ERR_NO_RESOURCE;
      }
      md->cuda_subscribed_ = true;
    }
  } catch (const std::bad_alloc&) {
    return UCS_ERR_NO_MEMORY;
  } catch (...) {
    ucs_error("gmd %s: unexpected failure opening the memory domain", name);
    return UCS_ERR_IO_ERROR;
  }
  ucs_debug("gmd %s: opened (cache alignment %zu, CUDA registration %s)", name, config.alignment,
            md->registrar_->cudaRegistration() ? "yes" : "no");
  *md_p = md.release()->handle();
  return UCS_OK;
}

Md::~Md() {
  if (registrar_ && config_.print_stats) {
    std::string line = registrar_->statsLine();
    if (cuda_backend_) {  // device memory registered on the NIC (GPUDirect)
      const GpuDirectStats g = cuda_backend_->stats();
      line += " gpudirect_dmabuf_regs=" + std::to_string(g.dmabuf_regs) +
              " gpudirect_peermem_regs=" + std::to_string(g.peermem_regs) +
              " gpudirect_dmabuf_offered=" + std::to_string(g.dmabuf_offered);
    }
    std::fprintf(stderr, "%s\n", line.c_str());
  }
  if (cuda_subscribed_) {
    memtype::Classifier::instance().unsubscribe(onCudaFree, &registrar_->cache());
  }
  if (cpu_subscribed_) cpu_monitor_->unsubscribe(&registrar_->cache());
  registrar_.reset();  // deregisters every cached registration
  cuda_backend_.reset();
  host_backend_.reset();
  if (pd_ != nullptr && ibv_dealloc_pd(pd_) != 0) {
    ucs_warn("gmd %s: ibv_dealloc_pd: %s (registrations still held at close?)", name_.c_str(),
             std::strerror(errno));
  }
  if (ctx_ != nullptr) ibv_close_device(ctx_);
}

}  // namespace gmd::md
