// Verbs test base shared by the rxe-labelled tests (plain verbs, the MD and the transport).
//
// It opens real RDMA devices through rdma-core, brings up RC queue pairs between two of them with QP
// numbers and GIDs exchanged in-process, and posts RDMA WRITE/READ work requests. On RoCE ports it uses
// the GID gmd_rc would choose (md/rc/rc_gid.h); on InfiniBand ports the LID.
//
// Thread safety: none; one fixture object per test thread.
#pragma once

#include <infiniband/verbs.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace gmd::test {

// Names of the RDMA devices present (rxe0, rxe1, mlx5_0, ...), sorted.
std::vector<std::string> rdmaDeviceNames();

// True inside the project's soft-RoCE VM (gtest/rxe/run-in-vm sets GMD_RXE_VM=1): there, a missing
// device is a failure of the harness, not a reason to skip.
bool insideRxeVm();

// Skip (on a host without RDMA) or fail (inside the VM) when fewer than `count` devices are present.
// Use as: GMD_REQUIRE_RDMA_DEVICES(2);
#define GMD_REQUIRE_RDMA_DEVICES(count)                                                    \
  do {                                                                                     \
    const auto gmd_devs_ = ::gmd::test::rdmaDeviceNames();                                 \
    if (gmd_devs_.size() < static_cast<std::size_t>(count)) {                              \
      if (::gmd::test::insideRxeVm()) {                                                    \
        FAIL() << "soft-RoCE VM has " << gmd_devs_.size() << " RDMA devices, need " << (count); \
      }                                                                                    \
      GTEST_SKIP() << "needs " << (count) << " RDMA devices, found " << gmd_devs_.size()    \
                   << " (run through gtest/rxe/run-in-vm)";                                \
    }                                                                                      \
  } while (0)

// An opened device port with its own protection domain and completion queue.
class VerbsPort {
 public:
  // Opens `device` (port 1 unless given). Returns nullptr and sets *error on failure.
  static std::unique_ptr<VerbsPort> open(const std::string& device, std::string* error,
                                         std::uint8_t port = 1);
  // Uses a context and protection domain owned by someone else (e.g. a gmd MD); only the CQ is
  // created and owned here.
  static std::unique_ptr<VerbsPort> wrap(ibv_context* ctx, ibv_pd* pd, const std::string& name,
                                         std::string* error, std::uint8_t port = 1);
  ~VerbsPort();
  VerbsPort(const VerbsPort&) = delete;
  VerbsPort& operator=(const VerbsPort&) = delete;

  ibv_context* context() const { return ctx_; }
  ibv_pd* pd() const { return pd_; }
  ibv_cq* cq() const { return cq_; }
  std::uint8_t port() const { return port_; }
  const std::string& name() const { return name_; }
  bool isEthernet() const { return attr_.link_layer == IBV_LINK_LAYER_ETHERNET; }
  std::uint16_t lid() const { return attr_.lid; }
  int gidIndex() const { return gid_index_; }
  const ibv_gid& gid() const { return gid_; }
  ibv_mtu activeMtu() const { return attr_.active_mtu; }

 private:
  VerbsPort() = default;
  bool init(std::string* error);  // port attributes, GID, CQ
  bool owned_ = true;
  std::string name_;
  ibv_context* ctx_ = nullptr;
  ibv_pd* pd_ = nullptr;
  ibv_cq* cq_ = nullptr;
  std::uint8_t port_ = 1;
  ibv_port_attr attr_{};
  int gid_index_ = -1;
  ibv_gid gid_{};
};

// What a peer needs to connect an RC QP to us.
struct RcAddress {
  std::uint32_t qpn = 0;
  std::uint32_t psn = 0;
  std::uint16_t lid = 0;
  ibv_gid gid{};
  bool use_gid = false;
};

// One RC queue pair on a VerbsPort (sharing its CQ; one outstanding work request at a time).
class RcQp {
 public:
  static std::unique_ptr<RcQp> create(VerbsPort& port, std::string* error);
  ~RcQp();
  RcQp(const RcQp&) = delete;
  RcQp& operator=(const RcQp&) = delete;

  RcAddress address() const;
  // INIT → RTR → RTS towards `remote`. Returns false and sets *error on failure.
  bool connect(const RcAddress& remote, std::string* error);
  ibv_qp* qp() const { return qp_; }

  // Post one signaled RDMA WRITE / READ and wait for its completion. Returns the completion status
  // (IBV_WC_SUCCESS on success); sets *error when posting or polling itself failed.
  ibv_wc_status write(const void* local, std::size_t length, std::uint32_t lkey,
                      std::uint64_t remote_addr, std::uint32_t rkey, std::string* error);
  ibv_wc_status read(void* local, std::size_t length, std::uint32_t lkey, std::uint64_t remote_addr,
                     std::uint32_t rkey, std::string* error);

 private:
  RcQp(VerbsPort& port) : port_(port) {}
  ibv_wc_status rdma(ibv_wr_opcode op, std::uint64_t local, std::size_t length, std::uint32_t lkey,
                     std::uint64_t remote_addr, std::uint32_t rkey, std::string* error);
  VerbsPort& port_;
  ibv_qp* qp_ = nullptr;
  std::uint32_t psn_ = 0;
  std::uint64_t next_wr_id_ = 1;
};

// Two ports (e.g. rxe1 and rxe0) with one connected RC QP pair between them.
struct RcPair {
  std::unique_ptr<VerbsPort> a, b;
  std::unique_ptr<RcQp> qa, qb;
  // Opens both devices and connects the pair. Returns false and sets *error on failure.
  bool open(const std::string& dev_a, const std::string& dev_b, std::string* error);
  // Connects a pair over two ports opened by the caller.
  bool connect(std::unique_ptr<VerbsPort> port_a, std::unique_ptr<VerbsPort> port_b,
               std::string* error);
};

// Fill `buf` with a pattern derived from `seed` / check it. Returns the first mismatching offset or
// `length` when all bytes match.
void fillPattern(void* buf, std::size_t length, std::uint64_t seed);
std::size_t checkPattern(const void* buf, std::size_t length, std::uint64_t seed);

}  // namespace gmd::test
