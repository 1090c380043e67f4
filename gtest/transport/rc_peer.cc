// A gmd_rc peer process for gtest/transport/rc_fault_test.cc, which kills it: opens gmd_rc on a
// device, registers a buffer, prints how to reach it, then serves RDMA passively until killed.
//
//   gmd_rc_peer DEVICE BYTES
//
// stdout, one line: "<device address hex> <iface address hex> <buffer address> <packed rkey hex>
// <holder pid>". Commands on stdin, one per line:
//   hold  a holder process (forked before UCX starts, so it shares no verbs resources) takes a copy
//         of every socket of this process and answers "held": a SIGKILL then destroys the QPs but
//         leaves the side channels open, as when a peer's host vanishes without a FIN
// EOF on stdin: exit. The holder lives until it is killed.
#include <dirent.h>
#include <dlfcn.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <uct/api/uct.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

int fail(const char* what) {
  std::fprintf(stderr, "gmd_rc_peer: %s\n", what);
  return 2;
}

std::string hex(const void* p, std::size_t n) {
  std::string s;
  char b[3];
  for (std::size_t i = 0; i < n; ++i) {
    std::snprintf(b, sizeof(b), "%02x", static_cast<const unsigned char*>(p)[i]);
    s += b;
  }
  return s;
}

// The holder: receives descriptors over `sock` and keeps them until killed.
[[noreturn]] void holder(int sock) {
  std::vector<int> kept;
  for (;;) {
    char byte;
    iovec iov{&byte, 1};
    alignas(cmsghdr) char ctl[CMSG_SPACE(sizeof(int))];
    msghdr m{};
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = ctl;
    m.msg_controllen = sizeof(ctl);
    if (recvmsg(sock, &m, 0) <= 0) break;
    for (cmsghdr* c = CMSG_FIRSTHDR(&m); c != nullptr; c = CMSG_NXTHDR(&m, c)) {
      if (c->cmsg_type == SCM_RIGHTS) {
        int fd;
        std::memcpy(&fd, CMSG_DATA(c), sizeof(fd));
        kept.push_back(fd);
      }
    }
  }
  for (;;) pause();
}

bool sendFd(int sock, int fd) {
  char byte = 0;
  iovec iov{&byte, 1};
  alignas(cmsghdr) char ctl[CMSG_SPACE(sizeof(int))] = {};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  m.msg_control = ctl;
  m.msg_controllen = sizeof(ctl);
  cmsghdr* c = CMSG_FIRSTHDR(&m);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &fd, sizeof(fd));
  return sendmsg(sock, &m, 0) == 1;
}

// Every socket of this process but `except`, to the holder.
int handOverSockets(int sock) {
  DIR* d = opendir("/proc/self/fd");
  if (d == nullptr) return -1;
  int n = 0;
  const int dfd = dirfd(d);
  while (dirent* e = readdir(d)) {
    const int fd = std::atoi(e->d_name);
    if (e->d_name[0] == '.' || fd == sock || fd == dfd) continue;
    struct stat st{};
    if (fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode) && sendFd(sock, fd)) ++n;
  }
  closedir(d);
  return n;
}

uct_component_h findGmd() {
  uct_component_h* comps = nullptr;
  unsigned n = 0;
  if (uct_query_components(&comps, &n) != UCS_OK) return nullptr;
  uct_component_h found = nullptr;
  for (unsigned i = 0; i < n; ++i) {
    uct_component_attr_t a{};
    a.field_mask = UCT_COMPONENT_ATTR_FIELD_NAME;
    if (uct_component_query(comps[i], &a) == UCS_OK && std::strcmp(a.name, "gmd") == 0) {
      found = comps[i];
    }
  }
  uct_release_component_list(comps);
  return found;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) return fail("usage: gmd_rc_peer DEVICE BYTES");
  const std::string dev = argv[1];
  const std::size_t len = std::strtoull(argv[2], nullptr, 0);
  int pair[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0) return fail("socketpair");
  const pid_t holder_pid = fork();
  if (holder_pid < 0) return fail("fork");
  if (holder_pid == 0) {
    close(pair[0]);
    holder(pair[1]);
  }
  close(pair[1]);

  if (dlopen(GMD_PLUGIN_PATH, RTLD_NOW | RTLD_GLOBAL) == nullptr) return fail(dlerror());
  uct_component_h comp = findGmd();
  if (comp == nullptr) return fail("component gmd not found");
  uct_md_config_t* mdc = nullptr;
  uct_md_h md = nullptr;
  if (uct_md_config_read(comp, nullptr, nullptr, &mdc) != UCS_OK ||
      uct_md_open(comp, dev.c_str(), mdc, &md) != UCS_OK) {
    return fail("uct_md_open");
  }
  uct_config_release(mdc);
  ucs_async_context_t* async = nullptr;
  uct_worker_h worker = nullptr;
  if (ucs_async_context_create(UCS_ASYNC_MODE_THREAD_SPINLOCK, &async) != UCS_OK ||
      uct_worker_create(async, UCS_THREAD_MODE_SINGLE, &worker) != UCS_OK) {
    return fail("worker");
  }
  uct_iface_config_t* ic = nullptr;
  if (uct_md_iface_config_read(md, "gmd_rc", nullptr, nullptr, &ic) != UCS_OK) {
    return fail("iface config");
  }
  const std::string port = dev + ":1";
  uct_iface_params_t p{};
  p.field_mask = UCT_IFACE_PARAM_FIELD_OPEN_MODE;
  p.open_mode = UCT_IFACE_OPEN_MODE_DEVICE;
  p.mode.device.tl_name = "gmd_rc";
  p.mode.device.dev_name = port.c_str();
  uct_iface_h iface = nullptr;
  if (uct_iface_open(md, worker, &p, ic, &iface) != UCS_OK) return fail("uct_iface_open");
  uct_config_release(ic);
  uct_iface_attr_t attr{};
  uct_md_attr_t mattr{};
  if (uct_iface_query(iface, &attr) != UCS_OK || uct_md_query(md, &mattr) != UCS_OK) {
    return fail("query");
  }
  std::vector<char> dev_addr(attr.device_addr_len), iface_addr(attr.iface_addr_len);
  std::vector<char> rkey(mattr.rkey_packed_size);
  void* buf = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  uct_mem_h memh = nullptr;
  if (buf == MAP_FAILED ||
      uct_iface_get_device_address(iface, reinterpret_cast<uct_device_addr_t*>(dev_addr.data())) !=
          UCS_OK ||
      uct_iface_get_address(iface, reinterpret_cast<uct_iface_addr_t*>(iface_addr.data())) !=
          UCS_OK ||
      uct_md_mem_reg(md, buf, len, UCT_MD_MEM_ACCESS_RMA, &memh) != UCS_OK ||
      uct_md_mkey_pack(md, memh, rkey.data()) != UCS_OK) {
    return fail("addresses and registration");
  }
  std::printf("%s %s %llu %s %d\n", hex(dev_addr.data(), dev_addr.size()).c_str(),
              hex(iface_addr.data(), iface_addr.size()).c_str(),
              static_cast<unsigned long long>(reinterpret_cast<std::uintptr_t>(buf)),
              hex(rkey.data(), rkey.size()).c_str(), static_cast<int>(holder_pid));
  std::fflush(stdout);

  char line[64];
  while (std::fgets(line, sizeof(line), stdin) != nullptr) {
    if (std::strncmp(line, "hold", 4) == 0) {
      std::printf("held %d\n", handOverSockets(pair[0]));
      std::fflush(stdout);
    }
  }
  // Orderly exit (the tests kill instead).
  uct_md_mem_dereg(md, memh);
  uct_iface_close(iface);
  uct_worker_destroy(worker);
  ucs_async_context_destroy(async);
  uct_md_close(md);
  return 0;
}
