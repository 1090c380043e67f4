// Registration through the public UCT API on a real RDMA device (run it inside the soft-RoCE VM:
// gtest/rxe/run-in-vm -- build/bench/gmd_bench --benchmark_filter=MdReg), gmd's MD side by side with
// UCX's own IB MD on the same device, and a miss side by side with a bare ibv_reg_mr + ibv_dereg_mr.
#include <benchmark/benchmark.h>
#include <dlfcn.h>
#include <infiniband/verbs.h>
#include <sys/mman.h>
#include <uct/api/uct.h>

#include <cstring>
#include <string>

namespace {

constexpr std::size_t kLen = 64 * 1024;
constexpr unsigned kFlags = UCT_MD_MEM_ACCESS_RMA;

// An MD of component `component` on the first RDMA device it lists, with optional config overrides.
class UctMd {
 public:
  UctMd(const char* component, const char* var = nullptr, const char* value = nullptr) {
    static void* plugin = dlopen(GMD_PLUGIN_PATH, RTLD_NOW | RTLD_GLOBAL);
    if (plugin == nullptr) {
      error_ = std::string("cannot load gmd: ") + dlerror();
      return;
    }
    uct_component_h* comps = nullptr;
    unsigned n = 0;
    if (uct_query_components(&comps, &n) != UCS_OK) return;
    for (unsigned i = 0; i < n && md_ == nullptr; ++i) {
      uct_component_attr_t attr{};
      attr.field_mask = UCT_COMPONENT_ATTR_FIELD_NAME | UCT_COMPONENT_ATTR_FIELD_MD_RESOURCE_COUNT;
      if (uct_component_query(comps[i], &attr) != UCS_OK || std::strcmp(attr.name, component) != 0 ||
          attr.md_resource_count == 0) {
        continue;
      }
      uct_md_resource_desc_t res[16];
      attr.field_mask = UCT_COMPONENT_ATTR_FIELD_MD_RESOURCES;
      attr.md_resources = res;
      if (attr.md_resource_count > 16 || uct_component_query(comps[i], &attr) != UCS_OK) continue;
      uct_md_config_t* config = nullptr;
      if (uct_md_config_read(comps[i], nullptr, nullptr, &config) != UCS_OK) continue;
      if (var != nullptr) uct_config_modify(config, var, value);
      device_ = res[0].md_name;
      if (uct_md_open(comps[i], res[0].md_name, config, &md_) != UCS_OK) md_ = nullptr;
      uct_config_release(config);
    }
    uct_release_component_list(comps);
    if (md_ == nullptr) error_ = std::string("no ") + component + " MD on an RDMA device";
  }
  ~UctMd() {
    if (md_ != nullptr) uct_md_close(md_);
  }
  uct_md_h md() const { return md_; }
  const std::string& error() const { return error_; }
  const std::string& device() const { return device_; }

 private:
  uct_md_h md_ = nullptr;
  std::string error_, device_;
};

void* mapBuffer() {
  void* p = mmap(nullptr, kLen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  std::memset(p, 1, kLen);
  return p;
}

void regLoop(benchmark::State& state, const UctMd& md) {
  if (md.md() == nullptr) {
    state.SkipWithError(md.error().c_str());
    return;
  }
  void* buf = mapBuffer();
  for (auto _ : state) {
    uct_mem_h memh;
    if (uct_md_mem_reg(md.md(), buf, kLen, kFlags, &memh) != UCS_OK) {
      state.SkipWithError("uct_md_mem_reg failed");
      break;
    }
    uct_md_mem_dereg(md.md(), memh);
  }
  state.SetLabel(md.device());
  munmap(buf, kLen);
}

// Hits: the same 64 KiB buffer registered and released again and again.
void MdRegHit_gmd(benchmark::State& state) { regLoop(state, UctMd("gmd")); }
void MdRegHit_ib(benchmark::State& state) { regLoop(state, UctMd("ib")); }

// Misses: nothing unused is kept, so every registration reaches the device and every release
// deregisters. The reference is the bare verbs pair on the same device.
void MdRegMiss_gmd(benchmark::State& state) {
  regLoop(state, UctMd("gmd", "RCACHE_MAX_UNUSED", "0"));
}

void MdRegMiss_verbs(benchmark::State& state) {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (list == nullptr || n == 0) {
    if (list != nullptr) ibv_free_device_list(list);
    state.SkipWithError("no RDMA device");
    return;
  }
  ibv_context* ctx = ibv_open_device(list[0]);
  state.SetLabel(ibv_get_device_name(list[0]));
  ibv_free_device_list(list);
  ibv_pd* pd = ctx != nullptr ? ibv_alloc_pd(ctx) : nullptr;
  void* buf = mapBuffer();
  for (auto _ : state) {
    ibv_mr* mr = pd != nullptr ? ibv_reg_mr(pd, buf, kLen,
                                            IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                                IBV_ACCESS_REMOTE_READ)
                               : nullptr;
    if (mr == nullptr) {
      state.SkipWithError("ibv_reg_mr failed");
      break;
    }
    ibv_dereg_mr(mr);
  }
  munmap(buf, kLen);
  if (pd != nullptr) ibv_dealloc_pd(pd);
  if (ctx != nullptr) ibv_close_device(ctx);
}

BENCHMARK(MdRegHit_gmd);
BENCHMARK(MdRegHit_ib);
BENCHMARK(MdRegMiss_gmd);
BENCHMARK(MdRegMiss_verbs);

}  // namespace
