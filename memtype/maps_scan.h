// memtype/maps_scan.h — the /proc/self/maps rule by which gmd marks ranges that may hold CUDA
// memory as of unknown type when its libucm memory-type events start (md/ucm_events.cc), as
// libucm_cuda does: a mapping is a candidate when it has no access (PROT_NONE: a CUDA
// reservation) or maps a /dev/nvidia* file (/dev/nvidiactl, /dev/nvidia-uvm, /dev/nvidia<N>).
// Standard library only (no UCX), so the GPU check (gtest/cuda/) compiles it too.
//
// Thread-safety: stateless; readProcMaps() reads the file whole before parsing it.
#pragma once

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace gmd::memtype::maps {

struct Mapping {
  std::uintptr_t start = 0;
  std::uintptr_t end = 0;
  std::string perms;  // "rw-p", "---p", ...
  std::string path;   // empty for an anonymous mapping
  bool candidate = false;  // PROT_NONE or a /dev/nvidia* mapping: possibly CUDA, type unknown
};

// The scan rule itself.
inline bool isCandidate(std::string_view perms, std::string_view path) {
  const bool no_access = perms.size() >= 3 && perms[0] == '-' && perms[1] == '-' && perms[2] == '-';
  return no_access || path.substr(0, 11) == "/dev/nvidia";
}

// One line of /proc/<pid>/maps; false for a line that is not a mapping.
inline bool parseLine(const std::string& line, Mapping* out) {
  unsigned long start = 0, end = 0;
  char perms[5] = {};
  int path_at = 0;
  if (std::sscanf(line.c_str(), "%lx-%lx %4s %*s %*s %*s %n", &start, &end, perms, &path_at) < 3 ||
      end <= start) {
    return false;
  }
  out->start = start;
  out->end = end;
  out->perms = perms;
  out->path = path_at > 0 && static_cast<std::size_t>(path_at) <= line.size()
                  ? line.substr(static_cast<std::size_t>(path_at))
                  : std::string();
  out->candidate = isCandidate(out->perms, out->path);
  return true;
}

// /proc/self/maps, read whole before anything is parsed (callers may map memory afterwards).
inline std::vector<Mapping> readProcMaps() {
  std::vector<Mapping> maps;
  std::ifstream in("/proc/self/maps");
  if (!in) return maps;
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::istringstream lines(text);
  std::string line;
  Mapping m;
  while (std::getline(lines, line)) {
    if (parseLine(line, &m)) maps.push_back(m);
  }
  return maps;
}

// Whether the candidate mappings cover [start, start + length) entirely (adjacent candidates
// together count: each is raised as its own unknown range).
inline bool coveredByCandidates(const std::vector<Mapping>& maps, std::uintptr_t start,
                                std::size_t length) {
  std::uintptr_t at = start;
  const std::uintptr_t end = start + length;
  for (const Mapping& m : maps) {  // /proc/self/maps lists mappings in address order
    if (!m.candidate || m.end <= at || m.start > at) continue;
    at = m.end;
    if (at >= end) return true;
  }
  return at >= end;
}

}  // namespace gmd::memtype::maps
