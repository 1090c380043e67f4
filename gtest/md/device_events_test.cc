// md/device_events: the MD-wide reader of a device context's async events keeps each
// LAST_WQE_REACHED for the QP's owner, whichever owner polled; a test reader stands in for the
// device (the real one runs in the rxe tests).
#include "md/device_events.h"

#include <gtest/gtest.h>

#include <deque>
#include <vector>

namespace gmd::md {
namespace {

struct FakeDevice {
  std::deque<ibv_async_event> pending;
  int acked = 0;
};
FakeDevice* g_dev = nullptr;

int fakeRead(ibv_context*, ibv_async_event* ev) {
  if (g_dev->pending.empty()) return -1;  // as the non-blocking fd: EAGAIN
  *ev = g_dev->pending.front();
  g_dev->pending.pop_front();
  return 0;
}
void fakeAck(ibv_async_event*) { ++g_dev->acked; }

class DeviceEventsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    g_dev = &dev_;
    events_.initForTest(reinterpret_cast<ibv_context*>(&dev_));
    for (std::size_t i = 0; i < qps_.size(); ++i) qps_[i].qp_num = 0x100 + static_cast<uint32_t>(i);
  }
  void TearDown() override { g_dev = nullptr; }
  void raise(ibv_event_type type, std::size_t qp) {
    ibv_async_event ev{};
    ev.event_type = type;
    ev.element.qp = &qps_[qp];
    dev_.pending.push_back(ev);
  }

  FakeDevice dev_;
  std::vector<ibv_qp> qps_ = std::vector<ibv_qp>(4);
  DeviceEvents events_{fakeRead, fakeAck};
};

// Owner A polls and reads B's event too; B still finds it, and each event is taken once.
TEST_F(DeviceEventsTest, LastWqeIsKeptForItsQpWhoeverPolled) {
  raise(IBV_EVENT_QP_LAST_WQE_REACHED, 0);  // A's
  raise(IBV_EVENT_QP_LAST_WQE_REACHED, 1);  // B's
  events_.poll();                           // A's progress
  EXPECT_TRUE(dev_.pending.empty());
  EXPECT_EQ(2, dev_.acked) << "every event read is acknowledged";
  EXPECT_TRUE(events_.takeLastWqe(0x100));
  EXPECT_FALSE(events_.takeLastWqe(0x100)) << "taken once";
  EXPECT_TRUE(events_.takeLastWqe(0x101)) << "B's event survived A's poll";
  EXPECT_FALSE(events_.takeLastWqe(0x102));
}

TEST_F(DeviceEventsTest, OtherEventsAreNotKept) {
  raise(IBV_EVENT_QP_FATAL, 2);
  raise(IBV_EVENT_SQ_DRAINED, 2);
  events_.poll();
  EXPECT_EQ(2, dev_.acked);
  EXPECT_FALSE(events_.takeLastWqe(0x102));
}

// A destroyed QP's number may come back: its kept event must not drain the new QP.
TEST_F(DeviceEventsTest, ForgetDropsAStaleEvent) {
  raise(IBV_EVENT_QP_LAST_WQE_REACHED, 3);
  events_.poll();
  events_.forget(0x103);
  EXPECT_FALSE(events_.takeLastWqe(0x103));
}

TEST_F(DeviceEventsTest, PollWithoutAContextDoesNothing) {
  DeviceEvents none(fakeRead, fakeAck);
  raise(IBV_EVENT_QP_LAST_WQE_REACHED, 0);
  none.poll();
  EXPECT_EQ(1u, dev_.pending.size());
  EXPECT_EQ(0, dev_.acked);
}

}  // namespace
}  // namespace gmd::md
