#include "src/common/dtype.h"

#include <catch2/catch.hpp>

namespace odb {
namespace {

TEST_CASE("dtype names round-trip and sizes are right") {
  for (uint32_t raw = 1; raw <= 10; ++raw) {
    REQUIRE(IsValidDType(raw));
    auto dtype = static_cast<DType>(raw);
    auto back = DTypeFromName(DTypeName(dtype));
    REQUIRE(back.has_value());
    CHECK(*back == dtype);
    CHECK(DTypeSize(dtype) > 0);
  }
  CHECK(DTypeSize(DType::kInt64) == 8);
  CHECK(DTypeSize(DType::kBFloat16) == 2);
  CHECK_FALSE(IsValidDType(0));
  CHECK_FALSE(IsValidDType(11));
  CHECK_FALSE(DTypeFromName("complex64").has_value());
}

}  // namespace
}  // namespace odb
