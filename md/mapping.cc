#include "md/mapping.h"

#include <infiniband/verbs.h>

#include <cstring>

namespace gmd::md {

ucs_status_t toUcsStatus(rcache::Status s) noexcept {
  switch (s) {
    case rcache::Status::kOk: return UCS_OK;
    case rcache::Status::kInvalidParam: return UCS_ERR_INVALID_PARAM;
    case rcache::Status::kNoMemory: return UCS_ERR_NO_MEMORY;
    case rcache::Status::kNoResource: return UCS_ERR_NO_RESOURCE;
    case rcache::Status::kExceedsLimit: return UCS_ERR_EXCEEDS_LIMIT;
    case rcache::Status::kUnsupported: return UCS_ERR_UNSUPPORTED;
    case rcache::Status::kIoError: return UCS_ERR_IO_ERROR;
  }
  return UCS_ERR_IO_ERROR;
}

unsigned toCacheAccess(unsigned uct_flags) noexcept {
  unsigned a = 0;
  if (uct_flags & UCT_MD_MEM_ACCESS_LOCAL_READ) a |= rcache::kAccessLocalRead;
  if (uct_flags & UCT_MD_MEM_ACCESS_LOCAL_WRITE) a |= rcache::kAccessLocalWrite;
  if (uct_flags & UCT_MD_MEM_ACCESS_REMOTE_GET) a |= rcache::kAccessRemoteRead;
  if (uct_flags & UCT_MD_MEM_ACCESS_REMOTE_PUT) a |= rcache::kAccessRemoteWrite;
  if (uct_flags & UCT_MD_MEM_ACCESS_REMOTE_ATOMIC) a |= rcache::kAccessRemoteAtomic;
  return a;
}

int toVerbsAccess(unsigned cache_access) noexcept {
  int v = 0;
  if (cache_access & rcache::kAccessLocalWrite) v |= IBV_ACCESS_LOCAL_WRITE;
  if (cache_access & rcache::kAccessRemoteRead) v |= IBV_ACCESS_REMOTE_READ;
  if (cache_access & rcache::kAccessRemoteWrite) v |= IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE;
  if (cache_access & rcache::kAccessRemoteAtomic) {
    v |= IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_LOCAL_WRITE;
  }
  return v;
}

ucs_memory_type_t toUcsMemType(MemType t) noexcept {
  switch (t) {
    case MemType::kHost: return UCS_MEMORY_TYPE_HOST;
    case MemType::kCuda: return UCS_MEMORY_TYPE_CUDA;
    case MemType::kCudaManaged: return UCS_MEMORY_TYPE_CUDA_MANAGED;
  }
  return UCS_MEMORY_TYPE_UNKNOWN;
}

void packRkey(std::uint32_t rkey, MemType type, void* buffer) noexcept {
  auto* b = static_cast<std::uint8_t*>(buffer);
  b[0] = kPackedRkeyVersion;
  b[1] = static_cast<std::uint8_t>(type);
  b[2] = 0;
  b[3] = 0;
  for (int i = 0; i < 4; ++i) b[4 + i] = static_cast<std::uint8_t>(rkey >> (8 * i));
}

ucs_status_t unpackRkey(const void* buffer, uct_rkey_t* rkey, MemType* type) noexcept {
  const auto* b = static_cast<const std::uint8_t*>(buffer);
  if (b[0] != kPackedRkeyVersion) return UCS_ERR_UNSUPPORTED;
  if (b[1] > static_cast<std::uint8_t>(MemType::kCudaManaged) || b[2] != 0 || b[3] != 0) {
    return UCS_ERR_INVALID_PARAM;
  }
  std::uint32_t k = 0;
  for (int i = 0; i < 4; ++i) k |= static_cast<std::uint32_t>(b[4 + i]) << (8 * i);
  *rkey = k;
  *type = static_cast<MemType>(b[1]);
  return UCS_OK;
}

}  // namespace gmd::md
