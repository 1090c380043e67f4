#include "gtest/rxe/verbs_fixture.h"

#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <random>

#include "md/rc/rc_gid.h"

namespace gmd::test {
namespace {

std::string errnoText(const char* what, int err) {
  return std::string(what) + ": " + std::strerror(err);
}

}  // namespace

std::vector<std::string> rdmaDeviceNames() {
  std::vector<std::string> names;
  int count = 0;
  ibv_device** list = ibv_get_device_list(&count);
  if (list == nullptr) return names;
  for (int i = 0; i < count; ++i) names.emplace_back(ibv_get_device_name(list[i]));
  ibv_free_device_list(list);
  std::sort(names.begin(), names.end());
  return names;
}

bool insideRxeVm() {
  const char* v = std::getenv("GMD_RXE_VM");
  return v != nullptr && std::strcmp(v, "1") == 0;
}

std::unique_ptr<VerbsPort> VerbsPort::open(const std::string& device, std::string* error,
                                           std::uint8_t port) {
  std::unique_ptr<VerbsPort> p(new VerbsPort());
  p->name_ = device;
  p->port_ = port;
  int count = 0;
  ibv_device** list = ibv_get_device_list(&count);
  if (list == nullptr) {
    *error = errnoText("ibv_get_device_list", errno);
    return nullptr;
  }
  for (int i = 0; i < count && p->ctx_ == nullptr; ++i) {
    if (device == ibv_get_device_name(list[i])) p->ctx_ = ibv_open_device(list[i]);
  }
  ibv_free_device_list(list);
  if (p->ctx_ == nullptr) {
    *error = "cannot open RDMA device " + device;
    return nullptr;
  }
  p->pd_ = ibv_alloc_pd(p->ctx_);
  if (p->pd_ == nullptr) {
    *error = errnoText("ibv_alloc_pd", errno);
    return nullptr;
  }
  if (!p->init(error)) return nullptr;
  return p;
}

std::unique_ptr<VerbsPort> VerbsPort::wrap(ibv_context* ctx, ibv_pd* pd, const std::string& name,
                                           std::string* error, std::uint8_t port) {
  std::unique_ptr<VerbsPort> p(new VerbsPort());
  p->owned_ = false;
  p->name_ = name;
  p->port_ = port;
  p->ctx_ = ctx;
  p->pd_ = pd;
  if (!p->init(error)) return nullptr;
  return p;
}

bool VerbsPort::init(std::string* error) {
  if (ibv_query_port(ctx_, port_, &attr_) != 0) {
    *error = errnoText("ibv_query_port", errno);
    return false;
  }
  if (attr_.state != IBV_PORT_ACTIVE) {
    *error = name_ + " port " + std::to_string(port_) + " is not active";
    return false;
  }
  if (isEthernet()) {
    gid_index_ = md::rc::selectRoceGid(ctx_, port_, &gid_);
    if (gid_index_ < 0) {
      *error = name_ + ": no usable RoCE GID";
      return false;
    }
  }
  cq_ = ibv_create_cq(ctx_, 64, nullptr, nullptr, 0);
  if (cq_ == nullptr) {
    *error = errnoText("ibv_create_cq", errno);
    return false;
  }
  return true;
}

VerbsPort::~VerbsPort() {
  if (cq_ != nullptr) ibv_destroy_cq(cq_);
  if (!owned_) return;
  if (pd_ != nullptr) ibv_dealloc_pd(pd_);
  if (ctx_ != nullptr) ibv_close_device(ctx_);
}

std::unique_ptr<RcQp> RcQp::create(VerbsPort& port, std::string* error) {
  std::unique_ptr<RcQp> q(new RcQp(port));
  ibv_qp_init_attr init{};
  init.send_cq = port.cq();
  init.recv_cq = port.cq();
  init.qp_type = IBV_QPT_RC;
  init.cap.max_send_wr = 16;
  init.cap.max_recv_wr = 16;
  init.cap.max_send_sge = 1;
  init.cap.max_recv_sge = 1;
  q->qp_ = ibv_create_qp(port.pd(), &init);
  if (q->qp_ == nullptr) {
    *error = errnoText("ibv_create_qp", errno);
    return nullptr;
  }
  std::mt19937 rng(q->qp_->qp_num);
  q->psn_ = rng() & 0xffffff;
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_INIT;
  attr.pkey_index = 0;
  attr.port_num = port.port();
  attr.qp_access_flags = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
  if (ibv_modify_qp(q->qp_, &attr,
                    IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) != 0) {
    *error = errnoText("ibv_modify_qp(INIT)", errno);
    return nullptr;
  }
  return q;
}

RcQp::~RcQp() {
  if (qp_ != nullptr) ibv_destroy_qp(qp_);
}

RcAddress RcQp::address() const {
  RcAddress a;
  a.qpn = qp_->qp_num;
  a.psn = psn_;
  a.lid = port_.lid();
  a.use_gid = port_.isEthernet();
  if (a.use_gid) a.gid = port_.gid();
  return a;
}

bool RcQp::connect(const RcAddress& remote, std::string* error) {
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_RTR;
  attr.path_mtu = std::min(port_.activeMtu(), IBV_MTU_4096);
  attr.dest_qp_num = remote.qpn;
  attr.rq_psn = remote.psn;
  attr.max_dest_rd_atomic = 1;
  attr.min_rnr_timer = 12;
  attr.ah_attr.port_num = port_.port();
  attr.ah_attr.dlid = remote.lid;
  if (remote.use_gid) {
    attr.ah_attr.is_global = 1;
    attr.ah_attr.grh.dgid = remote.gid;
    attr.ah_attr.grh.sgid_index = static_cast<std::uint8_t>(port_.gidIndex());
    attr.ah_attr.grh.hop_limit = 64;
  }
  if (ibv_modify_qp(qp_, &attr,
                    IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                        IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) != 0) {
    *error = errnoText("ibv_modify_qp(RTR)", errno);
    return false;
  }
  attr = ibv_qp_attr{};
  attr.qp_state = IBV_QPS_RTS;
  attr.sq_psn = psn_;
  attr.timeout = 14;
  attr.retry_cnt = 7;
  attr.rnr_retry = 7;
  attr.max_rd_atomic = 1;
  if (ibv_modify_qp(qp_, &attr,
                    IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                        IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC) != 0) {
    *error = errnoText("ibv_modify_qp(RTS)", errno);
    return false;
  }
  return true;
}

ibv_wc_status RcQp::rdma(ibv_wr_opcode op, std::uint64_t local, std::size_t length,
                         std::uint32_t lkey, std::uint64_t remote_addr, std::uint32_t rkey,
                         std::string* error) {
  ibv_sge sge{};
  sge.addr = local;
  sge.length = static_cast<std::uint32_t>(length);
  sge.lkey = lkey;
  ibv_send_wr wr{};
  ibv_send_wr* bad = nullptr;
  wr.wr_id = next_wr_id_++;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = op;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = remote_addr;
  wr.wr.rdma.rkey = rkey;
  if (int rc = ibv_post_send(qp_, &wr, &bad); rc != 0) {
    *error = errnoText("ibv_post_send", rc);
    return IBV_WC_GENERAL_ERR;
  }
  // Emulated RDMA in a TCG guest is slow: allow a generous minute for 8 MiB.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (;;) {
    ibv_wc wc{};
    const int n = ibv_poll_cq(port_.cq(), 1, &wc);
    if (n < 0) {
      *error = "ibv_poll_cq failed";
      return IBV_WC_GENERAL_ERR;
    }
    if (n == 1) {
      if (wc.wr_id != wr.wr_id) continue;  // a late completion of an earlier, timed-out request
      return wc.status;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      *error = "no completion within 60 s";
      return IBV_WC_GENERAL_ERR;
    }
  }
}

ibv_wc_status RcQp::write(const void* local, std::size_t length, std::uint32_t lkey,
                          std::uint64_t remote_addr, std::uint32_t rkey, std::string* error) {
  return rdma(IBV_WR_RDMA_WRITE, reinterpret_cast<std::uint64_t>(local), length, lkey, remote_addr,
              rkey, error);
}

ibv_wc_status RcQp::read(void* local, std::size_t length, std::uint32_t lkey,
                         std::uint64_t remote_addr, std::uint32_t rkey, std::string* error) {
  return rdma(IBV_WR_RDMA_READ, reinterpret_cast<std::uint64_t>(local), length, lkey, remote_addr,
              rkey, error);
}

bool RcPair::open(const std::string& dev_a, const std::string& dev_b, std::string* error) {
  auto pa = VerbsPort::open(dev_a, error);
  if (!pa) return false;
  auto pb = VerbsPort::open(dev_b, error);
  if (!pb) return false;
  return connect(std::move(pa), std::move(pb), error);
}

bool RcPair::connect(std::unique_ptr<VerbsPort> port_a, std::unique_ptr<VerbsPort> port_b,
                     std::string* error) {
  // QPs go first on destruction (declared after the ports).
  a = std::move(port_a);
  b = std::move(port_b);
  qa = RcQp::create(*a, error);
  if (!qa) return false;
  qb = RcQp::create(*b, error);
  if (!qb) return false;
  return qa->connect(qb->address(), error) && qb->connect(qa->address(), error);
}

void fillPattern(void* buf, std::size_t length, std::uint64_t seed) {
  auto* p = static_cast<std::uint8_t*>(buf);
  std::uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
  for (std::size_t i = 0; i < length; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    p[i] = static_cast<std::uint8_t>(x);
  }
}

std::size_t checkPattern(const void* buf, std::size_t length, std::uint64_t seed) {
  const auto* p = static_cast<const std::uint8_t*>(buf);
  std::uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
  for (std::size_t i = 0; i < length; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    if (p[i] != static_cast<std::uint8_t>(x)) return i;
  }
  return length;
}

}  // namespace gmd::test
