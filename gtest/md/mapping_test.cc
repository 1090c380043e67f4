#include "md/mapping.h"

#include <gtest/gtest.h>
#include <infiniband/verbs.h>

#include <cstdint>

namespace gmd::md {
namespace {

TEST(Mapping, EveryCacheStatusMapsToADistinctUcsError) {
  EXPECT_EQ(UCS_OK, toUcsStatus(rcache::Status::kOk));
  EXPECT_EQ(UCS_ERR_INVALID_PARAM, toUcsStatus(rcache::Status::kInvalidParam));
  EXPECT_EQ(UCS_ERR_NO_MEMORY, toUcsStatus(rcache::Status::kNoMemory));
  EXPECT_EQ(UCS_ERR_NO_RESOURCE, toUcsStatus(rcache::Status::kNoResource));
  EXPECT_EQ(UCS_ERR_EXCEEDS_LIMIT, toUcsStatus(rcache::Status::kExceedsLimit));
  EXPECT_EQ(UCS_ERR_UNSUPPORTED, toUcsStatus(rcache::Status::kUnsupported));
  EXPECT_EQ(UCS_ERR_IO_ERROR, toUcsStatus(rcache::Status::kIoError));
}

TEST(Mapping, UctAccessMapsToNarrowestVerbsAccess) {
  // Eager zcopy source: local read only → no verbs access bit at all.
  EXPECT_EQ(0, toVerbsAccess(toCacheAccess(UCT_MD_MEM_ACCESS_LOCAL_READ)));
  // Rendezvous GET target: remote read only, no write permission.
  EXPECT_EQ(IBV_ACCESS_REMOTE_READ, toVerbsAccess(toCacheAccess(UCT_MD_MEM_ACCESS_REMOTE_GET)));
  // Remote write needs local write in verbs.
  EXPECT_EQ(IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE,
            toVerbsAccess(toCacheAccess(UCT_MD_MEM_ACCESS_REMOTE_PUT)));
  EXPECT_EQ(IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_LOCAL_WRITE,
            toVerbsAccess(toCacheAccess(UCT_MD_MEM_ACCESS_REMOTE_ATOMIC)));
  EXPECT_EQ(IBV_ACCESS_LOCAL_WRITE, toVerbsAccess(toCacheAccess(UCT_MD_MEM_ACCESS_LOCAL_WRITE)));
  EXPECT_EQ(IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ |
                IBV_ACCESS_REMOTE_WRITE,
            toVerbsAccess(toCacheAccess(UCT_MD_MEM_ACCESS_ALL)));
  // Non-access flags do not grant access.
  EXPECT_EQ(0u, toCacheAccess(UCT_MD_MEM_FLAG_HIDE_ERRORS | UCT_MD_MEM_FLAG_NONBLOCK));
}

TEST(Mapping, MemTypesMapToUcx) {
  EXPECT_EQ(UCS_MEMORY_TYPE_HOST, toUcsMemType(MemType::kHost));
  EXPECT_EQ(UCS_MEMORY_TYPE_CUDA, toUcsMemType(MemType::kCuda));
  EXPECT_EQ(UCS_MEMORY_TYPE_CUDA_MANAGED, toUcsMemType(MemType::kCudaManaged));
}

TEST(Mapping, PackedRkeyRoundTripsAndHasDocumentedLayout) {
  std::uint8_t buf[kPackedRkeySize];
  packRkey(0xa1b2c3d4u, MemType::kCuda, buf);
  EXPECT_EQ(kPackedRkeyVersion, buf[0]);
  EXPECT_EQ(static_cast<std::uint8_t>(MemType::kCuda), buf[1]);
  EXPECT_EQ(0, buf[2]);
  EXPECT_EQ(0, buf[3]);
  EXPECT_EQ(0xd4, buf[4]);  // little-endian rkey
  EXPECT_EQ(0xa1, buf[7]);
  uct_rkey_t rkey = 0;
  MemType type = MemType::kHost;
  ASSERT_EQ(UCS_OK, unpackRkey(buf, &rkey, &type));
  EXPECT_EQ(0xa1b2c3d4u, rkey);
  EXPECT_EQ(MemType::kCuda, type);
}

TEST(Mapping, UnknownOrMalformedPackedRkeyIsRefused) {
  std::uint8_t buf[kPackedRkeySize];
  packRkey(42, MemType::kHost, buf);
  uct_rkey_t rkey = 7;
  MemType type = MemType::kHost;
  buf[0] = 2;  // a future format
  EXPECT_EQ(UCS_ERR_UNSUPPORTED, unpackRkey(buf, &rkey, &type));
  EXPECT_EQ(7u, rkey) << "output set on failure";
  buf[0] = kPackedRkeyVersion;
  buf[1] = 9;  // no such memory type
  EXPECT_EQ(UCS_ERR_INVALID_PARAM, unpackRkey(buf, &rkey, &type));
  buf[1] = 0;
  buf[2] = 1;  // reserved bits set
  EXPECT_EQ(UCS_ERR_INVALID_PARAM, unpackRkey(buf, &rkey, &type));
}

}  // namespace
}  // namespace gmd::md
