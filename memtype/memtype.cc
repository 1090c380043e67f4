#include "memtype/memtype.h"

namespace gmd::memtype {

Classifier& Classifier::instance() noexcept {
  static Classifier c;
  return c;
}
bool Classifier::cudaAvailable() const noexcept { return false; }
Info Classifier::classify(const void*, std::size_t) noexcept { return Info{}; }
bool Classifier::subscribe(FreeCallback, void*) noexcept { return true; }
void Classifier::unsubscribe(FreeCallback, void*) noexcept {}

}  // namespace gmd::memtype
