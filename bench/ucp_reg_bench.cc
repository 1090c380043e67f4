// Registration cost where UCP users feel it: ucp_mem_map and rendezvous tag traffic over RDMA, with
// gmd_rc under UCP's registration cache, gmd_rc with gmd's cache alone, and UCX's own rc_verbs + IB
// MD, side by side in one run (docs/design.md, "Who caches gmd's registrations").
//
//   UcpReg/map_hit/<size>/<config>    ucp_mem_map + ucp_mem_unmap of a buffer mapped before the loop
//   UcpReg/map_miss/<size>/<config>   the same on freshly mmap'd memory each iteration
//   UcpReg/rndv_hit/<size>/<config>   one tagged message (rendezvous: 64 KiB, 1 and 4 MiB), sender
//                                     and receiver buffers cycling over 8 of each that stay mapped
//                                     (the caches' hits)
//   UcpReg/rndv_miss/<size>/<config>  one tagged message between freshly mmap'd buffers each time
//
// <config>: `gmd_ucp` (UCX_TLS=gmd_rc,self; UCP's registration cache on, UCX_RCACHE_ENABLE=try, the
// default), `gmd_only` (gmd_rc, UCX_RCACHE_ENABLE=n: every registration UCP needs reaches gmd's
// cache), `rc_verbs` (UCX_TLS=rc_verbs,ud_verbs,self, UCP's cache on; the IB MD's own cache on
// 1.13; UCX_IB_GID_INDEX=0: ud_verbs, which carries rc's wireup, gets nothing through soft-RoCE
// on the IPv4 GID UCX picks itself).
//
// Two UCP contexts in one process: the receiver on the first RDMA device, the sender on the last
// (rxe0:1 and rxe1:1 in the soft-RoCE VM), rendezvous from 8 KiB. Each benchmark runs a fixed
// number of iterations once, in a context of its own; mmap, page touching and munmap of the miss
// cases are outside the timing. bench/ucp_reg_bench.sh runs each in its own process (so that gmd's
// counters, printed when an MD closes under UCX_GMD_PRINT_STATS=y, belong to one benchmark) and
// tabulates. Without an RDMA device every benchmark is skipped with that reason.
#include <benchmark/benchmark.h>
#include <dirent.h>
#include <dlfcn.h>
#include <sys/mman.h>
#include <ucp/api/ucp.h>
#include <uct/api/uct.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

namespace {

constexpr ucp_tag_t kTag = 0x72656762;
constexpr int kBuffers = 8;
constexpr auto kDeadline = std::chrono::seconds(60);

struct Config {
  const char* name;
  const char* tls;
  const char* rcache;
};
constexpr Config kConfigs[] = {
    {"gmd_ucp", "gmd_rc,self", "try"},
    {"gmd_only", "gmd_rc,self", "n"},
    {"rc_verbs", "rc_verbs,ud_verbs,self", "try"},
};

std::vector<std::string> rdmaDevices() {
  std::vector<std::string> out;
  if (DIR* d = opendir("/sys/class/infiniband")) {
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] != '.') out.emplace_back(e->d_name);
    }
    closedir(d);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Fresh anonymous memory with every page touched (so that registration pins present pages).
void* mapTouched(std::size_t size) {
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  const auto page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  for (std::size_t i = 0; i < size; i += page) static_cast<volatile char*>(p)[i] = 1;
  return p;
}

// Whether this UCX has the component named `name` (its IB transports are component "ib"; Debian's
// UCX 1.23.0~rc1 ships none).
bool hasComponent(const char* name) {
  uct_component_h* comps = nullptr;
  unsigned n = 0;
  if (uct_query_components(&comps, &n) != UCS_OK) return false;
  bool found = false;
  for (unsigned i = 0; i < n && !found; ++i) {
    uct_component_attr_t attr{};
    attr.field_mask = UCT_COMPONENT_ATTR_FIELD_NAME;
    found = uct_component_query(comps[i], &attr) == UCS_OK && std::strcmp(attr.name, name) == 0;
  }
  uct_release_component_list(comps);
  return found;
}

struct Done {
  bool done = false;
  ucs_status_t status = UCS_OK;
};
void sendDone(void*, ucs_status_t status, void* user) { *static_cast<Done*>(user) = {true, status}; }
void recvDone(void*, ucs_status_t status, const ucp_tag_recv_info_t*, void* user) {
  *static_cast<Done*>(user) = {true, status};
}

// A receiver and a sender context, each with one worker on one device, and the sender's endpoint.
class Pair {
 public:
  Pair(const Config& cfg, std::string* error) {
    static void* plugin = dlopen(GMD_PLUGIN_PATH, RTLD_NOW | RTLD_GLOBAL);  // never closed
    if (plugin == nullptr) {
      *error = std::string("cannot load gmd: ") + dlerror();
      return;
    }
    const std::vector<std::string> devs = rdmaDevices();
    if (devs.empty()) {
      *error = "no RDMA device (run it in the soft-RoCE VM)";
      return;
    }
    if (!open(cfg, devs.front() + ":1", &recv_, error) ||
        !open(cfg, devs.back() + ":1", &send_, error)) {
      return;
    }
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
    ep.address = reinterpret_cast<const ucp_address_t*>(recv_.address.data());
    if (const ucs_status_t st = ucp_ep_create(send_.worker, &ep, &ep_); st != UCS_OK) {
      *error = std::string("ucp_ep_create: ") + ucs_status_string(st);
      ep_ = nullptr;
    }
  }
  ~Pair() {
    if (ep_ != nullptr) {
      ucp_request_param_t p{};
      p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      p.flags = UCP_EP_CLOSE_FLAG_FORCE;
      void* req = ucp_ep_close_nbx(ep_, &p);
      const auto end = std::chrono::steady_clock::now() + kDeadline;
      while (UCS_PTR_IS_PTR(req) && ucp_request_check_status(req) == UCS_INPROGRESS &&
             std::chrono::steady_clock::now() < end) {
        progress();
      }
      if (UCS_PTR_IS_PTR(req)) ucp_request_free(req);
    }
    for (Peer* p : {&send_, &recv_}) {
      if (p->worker != nullptr) ucp_worker_destroy(p->worker);
      if (p->context != nullptr) ucp_cleanup(p->context);
    }
  }
  Pair(const Pair&) = delete;
  Pair& operator=(const Pair&) = delete;

  bool ok() const { return ep_ != nullptr; }
  ucp_context_h senderContext() const { return send_.context; }

  // One tagged message of `size` bytes from src to dst; false when it did not end OK in time.
  bool transfer(void* src, void* dst, std::size_t size) {
    Done sent, got;
    ucp_request_param_t rp{};
    rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    rp.cb.recv = recvDone;
    rp.user_data = &got;
    void* rreq = ucp_tag_recv_nbx(recv_.worker, dst, size, kTag, ~ucp_tag_t{0}, &rp);
    if (UCS_PTR_IS_ERR(rreq)) return false;
    if (rreq == nullptr) got.done = true;
    ucp_request_param_t sp{};
    sp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    sp.cb.send = sendDone;
    sp.user_data = &sent;
    void* sreq = ucp_tag_send_nbx(ep_, src, size, kTag, &sp);
    if (UCS_PTR_IS_ERR(sreq)) return false;
    if (sreq == nullptr) sent.done = true;
    const auto end = std::chrono::steady_clock::now() + kDeadline;
    while (!(sent.done && got.done) && std::chrono::steady_clock::now() < end) progress();
    if (UCS_PTR_IS_PTR(sreq)) ucp_request_free(sreq);
    if (UCS_PTR_IS_PTR(rreq)) ucp_request_free(rreq);
    return sent.done && got.done && sent.status == UCS_OK && got.status == UCS_OK;
  }

 private:
  struct Peer {
    ucp_context_h context = nullptr;
    ucp_worker_h worker = nullptr;
    std::vector<std::uint8_t> address;
  };

  static bool open(const Config& cfg, const std::string& device, Peer* peer, std::string* error) {
    ucp_config_t* config = nullptr;
    if (ucp_config_read(nullptr, nullptr, &config) != UCS_OK) {
      *error = "ucp_config_read failed";
      return false;
    }
    const std::pair<const char*, const char*> values[] = {{"NET_DEVICES", device.c_str()},
                                                          {"TLS", cfg.tls},
                                                          {"RNDV_THRESH", "8192"},
                                                          {"RCACHE_ENABLE", cfg.rcache}};
    for (const auto& [key, value] : values) {
      if (const ucs_status_t st = ucp_config_modify(config, key, value); st != UCS_OK) {
        *error = std::string("UCX_") + key + "=" + value + ": " + ucs_status_string(st);
        ucp_config_release(config);
        return false;
      }
    }
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = UCP_FEATURE_TAG;
    ucs_status_t st = ucp_init(&params, config, &peer->context);
    ucp_config_release(config);
    if (st != UCS_OK) {
      *error = std::string("ucp_init on ") + device + ": " + ucs_status_string(st);
      peer->context = nullptr;
      return false;
    }
    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SINGLE;
    if (st = ucp_worker_create(peer->context, &wp, &peer->worker); st != UCS_OK) {
      *error = std::string("ucp_worker_create: ") + ucs_status_string(st);
      peer->worker = nullptr;
      return false;
    }
    ucp_address_t* address = nullptr;
    std::size_t length = 0;
    if (st = ucp_worker_get_address(peer->worker, &address, &length); st != UCS_OK) {
      *error = std::string("ucp_worker_get_address: ") + ucs_status_string(st);
      return false;
    }
    const auto* bytes = reinterpret_cast<const std::uint8_t*>(address);
    peer->address.assign(bytes, bytes + length);
    ucp_worker_release_address(peer->worker, address);
    return true;
  }

  void progress() {
    ucp_worker_progress(send_.worker);
    ucp_worker_progress(recv_.worker);
  }

  Peer recv_, send_;
  ucp_ep_h ep_ = nullptr;
};

bool memMap(ucp_context_h context, void* address, std::size_t size, ucp_mem_h* memh) {
  ucp_mem_map_params_t p{};
  p.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  p.address = address;
  p.length = size;
  return ucp_mem_map(context, &p, memh) == UCS_OK;
}

enum class Op { kMapHit, kMapMiss, kRndvHit, kRndvMiss };

void run(benchmark::State& state, Op op, std::size_t size, const Config& cfg) {
  std::string error;
  // The IB transports' GID (read by their own configuration, not UCP's): this process runs one
  // benchmark (bench/ucp_reg_bench.sh), so the environment is its own.
  if (std::strcmp(cfg.name, "rc_verbs") == 0) {
    if (!hasComponent("ib")) {
      state.SkipWithError("this UCX has no IB transports (no rc_verbs)");
      return;
    }
    setenv("UCX_IB_GID_INDEX", "0", 0);
  }
  Pair pair(cfg, &error);
  if (!pair.ok()) {
    state.SkipWithError(error.empty() ? "UCP set-up failed" : error.c_str());
    return;
  }
  std::vector<void*> mine;
  auto release = [&] {
    for (void* p : mine) munmap(p, size);
    mine.clear();
  };
  bool failed = false;
  if (op == Op::kMapHit || op == Op::kRndvHit) {
    for (int i = 0; i < (op == Op::kMapHit ? 1 : 2 * kBuffers); ++i) {
      void* p = mapTouched(size);
      if (p == nullptr) {
        release();
        state.SkipWithError("mmap failed");
        return;
      }
      mine.push_back(p);
    }
  }
  std::size_t i = 0;
  for (auto _ : state) {
    switch (op) {
      case Op::kMapHit: {
        ucp_mem_h memh = nullptr;
        failed = !memMap(pair.senderContext(), mine[0], size, &memh);
        if (!failed) ucp_mem_unmap(pair.senderContext(), memh);
        break;
      }
      case Op::kMapMiss: {
        state.PauseTiming();
        void* p = mapTouched(size);
        state.ResumeTiming();
        ucp_mem_h memh = nullptr;
        failed = p == nullptr || !memMap(pair.senderContext(), p, size, &memh);
        if (!failed) ucp_mem_unmap(pair.senderContext(), memh);
        state.PauseTiming();
        if (p != nullptr) munmap(p, size);
        state.ResumeTiming();
        break;
      }
      case Op::kRndvHit:
        failed = !pair.transfer(mine[i % kBuffers], mine[kBuffers + (i + 3) % kBuffers], size);
        break;
      case Op::kRndvMiss: {
        state.PauseTiming();
        void* src = mapTouched(size);
        void* dst = mapTouched(size);
        state.ResumeTiming();
        failed = src == nullptr || dst == nullptr || !pair.transfer(src, dst, size);
        state.PauseTiming();
        for (void* p : {src, dst}) {
          if (p != nullptr) munmap(p, size);
        }
        state.ResumeTiming();
        break;
      }
    }
    if (failed) break;
    ++i;
  }
  release();
  if (failed) {
    state.SkipWithError("a registration or transfer failed");
    return;
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(i * size));
  unsigned major = 0, minor = 0, release_no = 0;
  ucp_get_version(&major, &minor, &release_no);
  state.SetLabel("UCX " + std::to_string(major) + "." + std::to_string(minor) + "." +
                 std::to_string(release_no) + ", " + cfg.tls + ", UCX_RCACHE_ENABLE=" + cfg.rcache);
}

// Iterations: few enough for the soft-RoCE VM (an emulated machine), the same for every config.
std::int64_t iterations(Op op, std::size_t size) {
  const bool large = size >= (std::size_t{1} << 20);
  switch (op) {
    case Op::kMapHit:
      return 2000;
    case Op::kMapMiss:
      return large ? 50 : 200;
    case Op::kRndvHit:
      return large ? 24 : 100;
    case Op::kRndvMiss:
      return large ? 12 : 50;
  }
  return 1;
}

const bool kRegistered = [] {
  constexpr std::size_t kKiB = 1024;
  const struct {
    const char* name;
    Op op;
    std::vector<std::size_t> sizes;
  } ops[] = {
      {"map_hit", Op::kMapHit, {64 * kKiB, 4096 * kKiB}},
      {"map_miss", Op::kMapMiss, {64 * kKiB, 4096 * kKiB}},
      {"rndv_hit", Op::kRndvHit, {64 * kKiB, 1024 * kKiB, 4096 * kKiB}},
      {"rndv_miss", Op::kRndvMiss, {64 * kKiB, 1024 * kKiB, 4096 * kKiB}},
  };
  for (const auto& o : ops) {
    for (const std::size_t size : o.sizes) {
      for (const Config& cfg : kConfigs) {
        const std::string name = std::string("UcpReg/") + o.name + "/" +
                                 std::to_string(size / kKiB) + "K/" + cfg.name;
        const Op op = o.op;
        benchmark::RegisterBenchmark(name.c_str(),
                                     [op, size, &cfg](benchmark::State& s) { run(s, op, size, cfg); })
            ->Iterations(iterations(op, size))
            ->Unit(benchmark::kMicrosecond)
            ->UseRealTime();
      }
    }
  }
  return true;
}();

}  // namespace
