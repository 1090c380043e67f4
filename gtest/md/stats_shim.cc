// Stands in for a UCX built with statistics (--enable-stats) where only such a build's libucs
// exports this function: preloaded beside gmd, it must make gmd's load-time check refuse
// (gtest/md/stats_guard_check.sh). Never called.
extern "C" __attribute__((visibility("default"))) int ucs_stats_node_alloc() { return -1; }
