// Loaded with dlopen by a unit test after gmd's hooks are installed: its binding to cuMemFree_v2 is
// made then, through the driver's redirected symbol table.
#include <cstdint>

extern "C" {
int cuMemFree_v2(std::uint64_t ptr);
int gmd_fake_late_free(std::uint64_t ptr) { return cuMemFree_v2(ptr); }
}
