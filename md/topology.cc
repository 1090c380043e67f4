// PCI addresses of verbs and CUDA devices, and their UCX system devices through an injected lookup.
#include "md/topology.h"

#include <limits.h>
#include <stdlib.h>

#include <cstdio>
#include <memory>

#include "memtype/memtype.h"

namespace gmd::md::topology {
namespace {

// Parses hex digits [pos, pos + n) of text, 1 <= n <= max_digits; advances pos.
bool hexField(std::string_view text, std::size_t* pos, std::size_t max_digits,
              std::uint32_t* out) noexcept {
  std::uint32_t v = 0;
  std::size_t n = 0;
  for (; *pos < text.size() && n < max_digits; ++*pos, ++n) {
    const char c = text[*pos];
    int d;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      d = c - 'a' + 10;
    } else if (c >= 'A' && c <= 'F') {
      d = c - 'A' + 10;
    } else {
      break;
    }
    v = v * 16 + static_cast<std::uint32_t>(d);
  }
  *out = v;
  return n > 0;
}

bool expect(std::string_view text, std::size_t* pos, char c) noexcept {
  if (*pos >= text.size() || text[*pos] != c) return false;
  ++*pos;
  return true;
}

}  // namespace

std::optional<PciAddress> parsePciAddress(std::string_view text) noexcept {
  // Two or three ':'-separated fields before the '.': with or without the domain.
  std::size_t colons = 0;
  for (char c : text) colons += c == ':';
  if (colons != 1 && colons != 2) return std::nullopt;
  std::size_t pos = 0;
  std::uint32_t domain = 0, bus = 0, slot = 0, function = 0;
  if (colons == 2 && !(hexField(text, &pos, 8, &domain) && expect(text, &pos, ':'))) {
    return std::nullopt;
  }
  if (!hexField(text, &pos, 2, &bus) || !expect(text, &pos, ':') ||
      !hexField(text, &pos, 2, &slot) || !expect(text, &pos, '.') ||
      !hexField(text, &pos, 1, &function) || pos != text.size()) {
    return std::nullopt;
  }
  if (domain > 0xffff || slot > 0x1f || function > 7) return std::nullopt;
  return PciAddress{static_cast<std::uint16_t>(domain), static_cast<std::uint8_t>(bus),
                    static_cast<std::uint8_t>(slot), static_cast<std::uint8_t>(function)};
}

std::string toString(const PciAddress& a) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "%04x:%02x:%02x.%x", a.domain, a.bus, a.slot, a.function);
  return buf;
}

std::optional<PciAddress> verbsDevicePci(const std::string& sysfs_root,
                                         std::string_view ibdev) noexcept {
  if (ibdev.empty() || ibdev.find('/') != std::string_view::npos || ibdev == "." || ibdev == "..") {
    return std::nullopt;
  }
  try {
    const std::string link = sysfs_root + "/class/infiniband/" + std::string(ibdev) + "/device";
    std::unique_ptr<char, decltype(&::free)> real(::realpath(link.c_str(), nullptr), &::free);
    if (real == nullptr) return std::nullopt;  // virtual device: no parent
    const std::string_view path(real.get());
    const std::size_t slash = path.rfind('/');
    return parsePciAddress(slash == std::string_view::npos ? path : path.substr(slash + 1));
  } catch (...) {
    return std::nullopt;  // out of memory building the path
  }
}

std::optional<PciAddress> cudaDevicePci(int ordinal) noexcept {
  char id[32] = {};
  if (!memtype::cudaDevicePciBusId(ordinal, id, sizeof(id))) return std::nullopt;
  return parsePciAddress(id);
}

std::uint8_t SysDevices::lookup(const std::optional<PciAddress>& address) const noexcept {
  std::uint8_t sys = kUnknownSysDevice;
  if (!address.has_value() || lookup_ == nullptr || !lookup_(*address, &sys)) {
    return kUnknownSysDevice;
  }
  return sys;
}

std::uint8_t SysDevices::verbsDevice(std::string_view ibdev) const noexcept {
  return lookup(verbsDevicePci(sysfs_root_, ibdev));
}

std::uint8_t SysDevices::cudaDevice(int ordinal) noexcept {
  if (ordinal < 0 || ordinal >= kMaxCudaDevices) return kUnknownSysDevice;
  std::int16_t v = cuda_[ordinal].load(std::memory_order_acquire);
  if (v == kNotLooked) {
    v = lookup(cudaDevicePci(ordinal));
    cuda_[ordinal].store(v, std::memory_order_release);
  }
  return static_cast<std::uint8_t>(v);
}

}  // namespace gmd::md::topology
