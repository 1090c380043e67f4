// Pure translations at the UCX edge: statuses, access flags, memory types and the packed remote key.
// No state, no I/O: unit-tested without a device (gtest/md/mapping_test.cc).
#pragma once

#include <ucs/memory/memory_type.h>
#include <uct/api/uct.h>

#include <cstddef>
#include <cstdint>

#include "common/mem_type.h"
#include "rcache/rcache.h"

namespace gmd::md {

// Every flag uct_md_mem_reg() may carry in UCX 1.13; any other bit is rejected.
inline constexpr unsigned kKnownMemFlags =
    UCT_MD_MEM_FLAG_NONBLOCK | UCT_MD_MEM_FLAG_FIXED | UCT_MD_MEM_FLAG_LOCK |
    UCT_MD_MEM_FLAG_HIDE_ERRORS | UCT_MD_MEM_ACCESS_ALL;

ucs_status_t toUcsStatus(rcache::Status s) noexcept;

// UCT access flags → the narrowest cache access bits that satisfy them (local read is implied by
// any registration; remote write and atomics need local write in verbs, the backend adds it).
unsigned toCacheAccess(unsigned uct_flags) noexcept;

// Cache access bits → ibv_access_flags (IBV_ACCESS_*), adding what verbs requires.
int toVerbsAccess(unsigned cache_access) noexcept;

ucs_memory_type_t toUcsMemType(MemType t) noexcept;

// Packed remote key, format version 1, 8 bytes, little-endian:
//   byte 0    format version (1)
//   byte 1    memory type of the registration (gmd::MemType)
//   bytes 2-3 reserved, zero
//   bytes 4-7 verbs rkey
// The unpacked uct_rkey_t is the verbs rkey in the low 32 bits.
inline constexpr std::size_t kPackedRkeySize = 8;
inline constexpr std::uint8_t kPackedRkeyVersion = 1;

void packRkey(std::uint32_t rkey, MemType type, void* buffer) noexcept;
// UCS_ERR_UNSUPPORTED for an unknown format version, UCS_ERR_INVALID_PARAM for a malformed one.
ucs_status_t unpackRkey(const void* buffer, uct_rkey_t* rkey, MemType* type) noexcept;

}  // namespace gmd::md
