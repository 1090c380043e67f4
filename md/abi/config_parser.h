// Config calls whose shape changed across UCX releases, for code that handles config tables itself
// (tests): ucs_config_parser_fill_opts() takes (table, env prefix, table prefix) up to 1.14 and a
// config list entry from 1.15 on; uct_config_modify() matches a field's bare name up to 1.14 and
// the name with the table's prefix from 1.15 on.
#pragma once

#include <ucs/config/parser.h>
#include <uct/api/uct.h>

#include <cstddef>
#include <string>
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

// uct_config_modify(config, name, value) for a field `name` of a table with `table_prefix`
// (e.g. "GMD_RC_" and "MAX_READ"), in the form the running UCX matches.
inline ucs_status_t configModify(void* config, const char* table_prefix, const char* name,
                                 const char* value) {
  ucs_status_t st = uct_config_modify(config, name, value);
  if (st == UCS_ERR_NO_ELEM) {
    st = uct_config_modify(config, (std::string(table_prefix) + name).c_str(), value);
  }
  return st;
}

}  // namespace gmd::ucx
