// Host memory keeps its speed: what a live CUDA allocation costs host-memory sends once gmd raises
// libucm's memory-type events (md/ucm_events.cc) and UCX's memtype cache stops being empty.
//
//   UcpHostPingPong/<state>  8-byte ucp_tag_send_nbx ping-pong between two workers of one process,
//                            host buffers; one iteration is a round trip.
//   UctHostAmShort/<state>   8-byte uct_ep_am_short ping-pong between two ifaces of one process
//                            over the shared-memory transport posix (sm), host buffers.
//
// <state> is `no_device`: no device allocation alive, or `device_alive`: one 8 MiB cuMemAlloc'd
// buffer of the fake driver alive for the whole benchmark. Each run labels what the memtype cache
// held during the loop: `cache=empty` (UCP's inline fast path taken without a lookup),
// `cache=N regions` (a lookup per host send), or `cache=off` (UCX_MEMTYPE_CACHE=n: every send asks
// the detect MDs). The cache is process-global, so UCX_MEMTYPE_CACHE=n is a separate invocation.
//
// UCP runs with UCX_TLS=self,sm,tcp unless UCX_TLS is set (two workers of one process talk over
// shared memory; no RDMA). gmd's plugin is loaded (dlopen of the plugin this build made) before
// ucp_init, so gmd's component registers and starts the CUDA memory events when UCP lists its MDs.
// The fake driver is found as memtype_bench.cc finds it (GMD_CUDA_DRIVER_PATH).
#include <benchmark/benchmark.h>
#include <dlfcn.h>
#include <ucp/api/ucp.h>
#include <ucs/async/async_fwd.h>
#include <uct/api/uct.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bench/ucs_compat.h"
#include "memtype/cuda_driver.h"
#include "memtype/memtype.h"

namespace {

constexpr std::size_t kDeviceBytes = 8 << 20;
constexpr ucp_tag_t kTag = 0x1234;

std::string cacheLabel() {
  if (ucs_memtype_cache_global_instance == nullptr) return "cache=off";
  const auto n = ucs_memtype_cache_global_instance->pgtable.num_regions;
  return n == 0 ? "cache=empty" : "cache=" + std::to_string(n) + " regions";
}

// gmd's plugin, loaded before UCX lists its components.
bool loadGmd(std::string* error) {
  static void* plugin = dlopen(GMD_PLUGIN_PATH, RTLD_NOW | RTLD_GLOBAL);  // never closed
  if (plugin == nullptr) *error = std::string("cannot load gmd: ") + dlerror();
  return plugin != nullptr;
}

// One cuMemAlloc'd buffer of the fake driver, alive while this object is, through the driver
// gmd's classifier loaded (the entry point is looked up the way an application does, so it comes
// back hooked and gmd raises the allocation).
class DeviceBuffer {
 public:
  DeviceBuffer() {
    const gmd::memtype::detail::DriverApi* api = gmd::memtype::detail::driver();
    if (api == nullptr || !api->is_fake) return;
    auto init = reinterpret_cast<int (*)(unsigned)>(dlsym(RTLD_DEFAULT, "cuInit"));
    auto alloc = reinterpret_cast<int (*)(std::uint64_t*, std::size_t)>(
        dlsym(RTLD_DEFAULT, "cuMemAlloc_v2"));
    free_ = reinterpret_cast<int (*)(std::uint64_t)>(dlsym(RTLD_DEFAULT, "cuMemFree_v2"));
    if (alloc == nullptr) {
      alloc = reinterpret_cast<int (*)(std::uint64_t*, std::size_t)>(
          dlsym(api->handle, "cuMemAlloc_v2"));
      free_ = reinterpret_cast<int (*)(std::uint64_t)>(dlsym(api->handle, "cuMemFree_v2"));
      init = reinterpret_cast<int (*)(unsigned)>(dlsym(api->handle, "cuInit"));
    }
    if (init != nullptr) (void)init(0);
    if (alloc == nullptr || alloc(&ptr_, kDeviceBytes) != 0) ptr_ = 0;
  }
  ~DeviceBuffer() {
    if (ptr_ != 0 && free_ != nullptr) (void)free_(ptr_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  bool ok() const { return ptr_ != 0; }

 private:
  std::uint64_t ptr_ = 0;
  int (*free_)(std::uint64_t) = nullptr;
};

// ---- UCP: one context, two workers, an endpoint each way.

class UcpPair {
 public:
  static UcpPair& instance() {
    static UcpPair p;
    return p;
  }
  const std::string& error() const { return error_; }
  // The transports of w0's endpoint, as ucp_ep_print_info lists them ("posix/memory ...").
  std::string transports() const {
    char* text = nullptr;
    std::size_t size = 0;
    FILE* f = open_memstream(&text, &size);
    if (f == nullptr) return "?";
    ucp_ep_print_info(eps_[0], f);
    std::fclose(f);
    std::string out;
    for (const char* tl : {"self/", "posix/", "sysv/", "xpmem/", "cma/", "knem/", "tcp/"}) {
      if (text != nullptr && std::strstr(text, tl) != nullptr) {
        out += (out.empty() ? "" : ",") + std::string(tl, std::strlen(tl) - 1);
      }
    }
    std::free(text);
    return out.empty() ? "?" : out;
  }

  // One round trip: w0 -> w1, then w1 -> w0, 8 bytes each way.
  bool roundTrip() { return oneWay(0, 1) && oneWay(1, 0); }

 private:
  UcpPair() {
    if (!loadGmd(&error_)) return;
    setenv("UCX_TLS", "self,sm,tcp,gmd_copy", 0);
    ucp_config_t* config = nullptr;
    if (ucp_config_read(nullptr, nullptr, &config) != UCS_OK) {
      error_ = "ucp_config_read failed";
      return;
    }
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = UCP_FEATURE_TAG;
    const ucs_status_t st = ucp_init(&params, config, &context_);
    ucp_config_release(config);
    if (st != UCS_OK) {
      error_ = std::string("ucp_init: ") + ucs_status_string(st);
      return;
    }
    for (auto& w : workers_) {
      ucp_worker_params_t wp{};
      wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
      wp.thread_mode = UCS_THREAD_MODE_SINGLE;
      if (ucp_worker_create(context_, &wp, &w) != UCS_OK) {
        error_ = "ucp_worker_create failed";
        return;
      }
    }
    for (int i = 0; i < 2; ++i) {
      ucp_address_t* addr = nullptr;
      std::size_t len = 0;
      if (ucp_worker_get_address(workers_[1 - i], &addr, &len) != UCS_OK) {
        error_ = "ucp_worker_get_address failed";
        return;
      }
      ucp_ep_params_t ep{};
      ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
      ep.address = addr;
      const ucs_status_t s = ucp_ep_create(workers_[i], &ep, &eps_[i]);
      ucp_worker_release_address(workers_[1 - i], addr);
      if (s != UCS_OK) {
        error_ = std::string("ucp_ep_create: ") + ucs_status_string(s);
        return;
      }
    }
    // Wire both endpoints up before measuring.
    for (int i = 0; i < 100 && error_.empty(); ++i) {
      if (!roundTrip()) error_ = "warm-up round trip failed";
    }
  }

  void progress() {
    ucp_worker_progress(workers_[0]);
    ucp_worker_progress(workers_[1]);
  }

  bool wait(void* req) {
    if (req == nullptr) return true;
    if (UCS_PTR_IS_ERR(req)) return false;
    ucs_status_t st;
    while ((st = ucp_request_check_status(req)) == UCS_INPROGRESS) progress();
    ucp_request_free(req);
    return st == UCS_OK;
  }

  bool oneWay(int from, int to) {
    ucp_request_param_t rp{};
    void* rreq = ucp_tag_recv_nbx(workers_[to], &rbuf_[to], sizeof(rbuf_[to]), kTag,
                                  ~ucp_tag_t{0}, &rp);
    ucp_request_param_t sp{};
    void* sreq = ucp_tag_send_nbx(eps_[from], &sbuf_[from], sizeof(sbuf_[from]), kTag, &sp);
    return wait(sreq) && wait(rreq);
  }

  std::string error_;
  ucp_context_h context_ = nullptr;
  ucp_worker_h workers_[2] = {};
  ucp_ep_h eps_[2] = {};
  std::uint64_t sbuf_[2] = {1, 2};
  std::uint64_t rbuf_[2] = {};
};

void UcpHostPingPong(benchmark::State& state, bool device_alive) {
  UcpPair& pair = UcpPair::instance();
  if (!pair.error().empty()) {
    state.SkipWithError(pair.error().c_str());
    return;
  }
  std::unique_ptr<DeviceBuffer> device;
  if (device_alive) {
    device = std::make_unique<DeviceBuffer>();
    if (!device->ok()) {
      state.SkipWithError("needs the fake CUDA driver (GMD_CUDA_DRIVER_PATH)");
      return;
    }
  }
  const std::string label = cacheLabel() + " tl=" + pair.transports();
  for (auto _ : state) {
    if (!pair.roundTrip()) {
      state.SkipWithError("round trip failed");
      break;
    }
  }
  state.SetLabel(label);
}
BENCHMARK_CAPTURE(UcpHostPingPong, no_device, false);
BENCHMARK_CAPTURE(UcpHostPingPong, device_alive, true);

// ---- UCT: two ifaces of the posix (sm) transport, an endpoint each way, am_short.

class UctPair {
 public:
  static UctPair& instance() {
    static UctPair p;
    return p;
  }
  const std::string& error() const { return error_; }

  bool roundTrip() { return oneWay(0, 1) && oneWay(1, 0); }

 private:
  static ucs_status_t onAm(void* arg, void*, std::size_t, unsigned) {
    ++*static_cast<unsigned*>(arg);
    return UCS_OK;
  }

  UctPair() {
    if (!loadGmd(&error_)) return;
    if (ucs_async_context_create(UCS_ASYNC_MODE_THREAD_SPINLOCK, &async_) != UCS_OK ||
        uct_worker_create(async_, UCS_THREAD_MODE_SINGLE, &worker_) != UCS_OK) {
      error_ = "uct worker creation failed";
      return;
    }
    uct_component_h* comps = nullptr;
    unsigned n = 0;
    if (uct_query_components(&comps, &n) != UCS_OK) {
      error_ = "uct_query_components failed";
      return;
    }
    for (unsigned i = 0; i < n && md_ == nullptr; ++i) {
      uct_component_attr_t attr{};
      attr.field_mask = UCT_COMPONENT_ATTR_FIELD_NAME;
      if (uct_component_query(comps[i], &attr) != UCS_OK || std::strcmp(attr.name, "posix") != 0) {
        continue;
      }
      uct_md_config_t* mc = nullptr;
      if (uct_md_config_read(comps[i], nullptr, nullptr, &mc) != UCS_OK) continue;
      (void)uct_md_open(comps[i], "posix", mc, &md_);
      uct_config_release(mc);
    }
    uct_release_component_list(comps);
    if (md_ == nullptr) {
      error_ = "no posix (sm) memory domain";
      return;
    }
    for (int i = 0; i < 2; ++i) {
      uct_iface_config_t* ic = nullptr;
      if (uct_md_iface_config_read(md_, "posix", nullptr, nullptr, &ic) != UCS_OK) {
        error_ = "uct_md_iface_config_read failed";
        return;
      }
      uct_iface_params_t ip{};
      ip.field_mask = UCT_IFACE_PARAM_FIELD_OPEN_MODE | UCT_IFACE_PARAM_FIELD_DEVICE;
      ip.open_mode = UCT_IFACE_OPEN_MODE_DEVICE;
      ip.mode.device.tl_name = "posix";
      ip.mode.device.dev_name = "memory";
      const ucs_status_t st = uct_iface_open(md_, worker_, &ip, ic, &ifaces_[i]);
      uct_config_release(ic);
      if (st != UCS_OK) {
        error_ = std::string("uct_iface_open(posix): ") + ucs_status_string(st);
        return;
      }
      uct_iface_set_am_handler(ifaces_[i], 1, onAm, &received_[i], 0);
      uct_iface_progress_enable(ifaces_[i], UCT_PROGRESS_SEND | UCT_PROGRESS_RECV);
    }
    uct_iface_attr_t attr{};
    if (uct_iface_query(ifaces_[0], &attr) != UCS_OK) {
      error_ = "uct_iface_query failed";
      return;
    }
    for (int i = 0; i < 2; ++i) {
      std::vector<char> dev(attr.device_addr_len), ifa(attr.iface_addr_len);
      auto* da = reinterpret_cast<uct_device_addr_t*>(dev.data());
      auto* ia = reinterpret_cast<uct_iface_addr_t*>(ifa.data());
      if (uct_iface_get_device_address(ifaces_[1 - i], da) != UCS_OK ||
          uct_iface_get_address(ifaces_[1 - i], ia) != UCS_OK) {
        error_ = "uct address query failed";
        return;
      }
      uct_ep_params_t ep{};
      ep.field_mask = UCT_EP_PARAM_FIELD_IFACE | UCT_EP_PARAM_FIELD_DEV_ADDR |
                      UCT_EP_PARAM_FIELD_IFACE_ADDR;
      ep.iface = ifaces_[i];
      ep.dev_addr = da;
      ep.iface_addr = ia;
      if (uct_ep_create(&ep, &eps_[i]) != UCS_OK) {
        error_ = "uct_ep_create failed";
        return;
      }
    }
  }

  bool oneWay(int from, int to) {
    const unsigned target = received_[to] + 1;
    ucs_status_t st;
    while ((st = uct_ep_am_short(eps_[from], 1, 0, &buf_[from], sizeof(buf_[from]))) ==
           UCS_ERR_NO_RESOURCE) {
      uct_worker_progress(worker_);
    }
    if (st != UCS_OK) return false;
    while (received_[to] != target) uct_worker_progress(worker_);
    return true;
  }

  std::string error_;
  ucs_async_context_t* async_ = nullptr;
  uct_worker_h worker_ = nullptr;
  uct_md_h md_ = nullptr;
  uct_iface_h ifaces_[2] = {};
  uct_ep_h eps_[2] = {};
  unsigned received_[2] = {};
  std::uint64_t buf_[2] = {1, 2};
};

void UctHostAmShort(benchmark::State& state, bool device_alive) {
  UctPair& pair = UctPair::instance();
  if (!pair.error().empty()) {
    state.SkipWithError(pair.error().c_str());
    return;
  }
  std::unique_ptr<DeviceBuffer> device;
  if (device_alive) {
    device = std::make_unique<DeviceBuffer>();
    if (!device->ok()) {
      state.SkipWithError("needs the fake CUDA driver (GMD_CUDA_DRIVER_PATH)");
      return;
    }
  }
  const std::string label = cacheLabel();
  for (auto _ : state) {
    if (!pair.roundTrip()) {
      state.SkipWithError("am_short failed");
      break;
    }
  }
  state.SetLabel(label);
}
BENCHMARK_CAPTURE(UctHostAmShort, no_device, false);
BENCHMARK_CAPTURE(UctHostAmShort, device_alive, true);

}  // namespace
