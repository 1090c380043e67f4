// ucs_config_parser_fill_opts() across UCX releases: up to 1.14 it takes (table, env prefix, table
// prefix), from 1.15 on a config list entry. Public API in both shapes; this picks the one the
// installed header declares, for code that parses a config table itself (unit tests).
#pragma once

#include <ucs/config/parser.h>

#include <cstddef>
#include <type_traits>

namespace gmd::ucx {

template <typename Fill = decltype(ucs_config_parser_fill_opts)>
ucs_status_t fillConfig(void* opts, ucs_config_field_t* table, std::size_t size,
                        const char* env_prefix, const char* table_prefix) {
  Fill* fill = &ucs_config_parser_fill_opts;  // dependent: only the matching branch is compiled
  if constexpr (std::is_invocable_v<Fill*, void*, ucs_config_global_list_entry_t*, const char*,
                                    int>) {
    ucs_config_global_list_entry_t entry{};
    entry.name = table_prefix;
    entry.prefix = table_prefix;
    entry.table = table;
    entry.size = size;
    return fill(opts, &entry, env_prefix, 0);
  } else {
    return fill(opts, table, env_prefix, table_prefix, 0);
  }
}

}  // namespace gmd::ucx
