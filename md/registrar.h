// The registration path of a gmd MD, without the verbs device: argument checks, memory-type
// routing, the registration cache, invalidation with completion, and counters. md/md.cc wraps it in
// UCX's MD ops; unit tests drive it with fake backends and a fake classifier
// (gtest/md/registrar_test.cc).
//
// Thread safety: reg()/dereg() may be called from any thread concurrently (the cache's contract).
#pragma once

#include <uct/api/uct.h>

#include <memory>
#include <string>

#include "md/ucx_abi.h"
#include "md/verbs_backend.h"
#include "memtype/memtype.h"
#include "rcache/rcache.h"

namespace gmd::md {

using ClassifyFn = memtype::Info (*)(const void* address, std::size_t length);

// What the MD does with CUDA managed memory (UCX_GMD_CUDA_MANAGED; the values index
// kManagedPolicyNames, which UCX's parser fills in directly).
enum class ManagedPolicy : unsigned {
  kRefuse = 0,     // UCS_ERR_UNSUPPORTED; cuda-managed stays out of reg_mem_types (default)
  kHostPages = 1,  // registered through the host backend, as the virtual range it is
};
extern const char* kManagedPolicyNames[];  // "refuse", "host-pages", nullptr

class Registrar {
 public:
  // `host` registers host pages; `cuda` device memory (nullptr: no GPUDirect on this device).
  // Neither is owned. The cache is owned.
  Registrar(std::string md_name, std::unique_ptr<rcache::Cache> cache, rcache::Backend* host,
            rcache::Backend* cuda, ClassifyFn classify);
  ~Registrar();
  Registrar(const Registrar&) = delete;
  Registrar& operator=(const Registrar&) = delete;

  // uct_md_mem_reg semantics: *memh_p is an rcache::Region held until dereg(). Caller mistakes
  // (bad range or flags, memory of a type this MD does not register) are returned with a debug
  // line, as UCX's own MDs do; failures of the system (the device, the driver, resources) are
  // logged once at error level, or at diag level under UCT_MD_MEM_FLAG_HIDE_ERRORS.
  ucs_status_t reg(void* address, std::size_t length, unsigned flags, uct_mem_h* memh_p) noexcept;
  // uct_md_mem_dereg semantics, with UCT_MD_MEM_DEREG_FLAG_INVALIDATE: the region leaves the cache
  // and `comp` is called once its registration is deregistered (after every other holder released
  // it). Bad parameters are caller mistakes: returned with a debug line.
  ucs_status_t dereg(const ucx::DeregParams* params) noexcept;

  bool cudaRegistration() const noexcept { return cuda_ != nullptr; }
  // Managed memory under kHostPages goes to the host backend; kRefuse (the default) refuses it.
  void setManagedPolicy(ManagedPolicy policy) noexcept { managed_ = policy; }
  ManagedPolicy managedPolicy() const noexcept { return managed_; }
  // Whether a cache hit on device memory must be classified again (buffer-ID validation of CUDA
  // frees); host hits never are.
  void setValidateDeviceHits(bool on) noexcept { validate_device_hits_ = on; }
  rcache::Cache& cache() noexcept { return *cache_; }
  const std::string& name() const noexcept { return name_; }
  // The line UCX_GMD_PRINT_STATS prints for this MD.
  std::string statsLine() const;

 private:
  struct Lookup;  // one reg() call's classification, filled in by resolve() on a miss
  static rcache::Resolution resolve(void* lookup, const void* address, std::size_t length) noexcept;
  rcache::Backend* backendFor(MemType type) const noexcept;

  std::string name_;
  std::unique_ptr<rcache::Cache> cache_;
  std::unique_ptr<CompletingBackend> host_;
  std::unique_ptr<CompletingBackend> cuda_;
  ClassifyFn classify_;
  bool validate_device_hits_ = false;
  ManagedPolicy managed_ = ManagedPolicy::kRefuse;
};

}  // namespace gmd::md
