#include "src/wire/tensor_codec.h"

#include <catch2/catch.hpp>

namespace odb::wire {
namespace {

using Descs = google::protobuf::RepeatedPtrField<TensorDesc>;

TensorDesc Desc(const std::string& name, odb::DType dtype, std::vector<int64_t> shape,
                uint32_t frame) {
  TensorDesc d;
  EncodeTensorDesc(name, dtype, shape, frame, &d);
  return d;
}

Descs One(const TensorDesc& d) {
  Descs descs;
  *descs.Add() = d;
  return descs;
}

// Decodes expecting failure; returns the message and stores the code.
std::string Fails(const Descs& descs, std::vector<size_t> sizes, ErrorCode expected,
                  const TensorDescLimits& limits = {}) {
  ErrorCode code = ERROR_CODE_UNSPECIFIED;
  auto got = DecodeTensorDescs(descs, sizes, limits, &code);
  REQUIRE_FALSE(got.ok());
  CHECK(code == expected);
  CHECK(got.status().code() == absl::StatusCode::kInvalidArgument);
  return std::string(got.status().message());
}

TEST_CASE("encode then decode round-trips a description") {
  Descs descs;
  *descs.Add() = Desc("input_ids", odb::DType::kInt64, {5}, 2);
  *descs.Add() = Desc("pixels", odb::DType::kFloat16, {2, 3, 4}, 1);
  *descs.Add() = Desc("flag", odb::DType::kBool, {}, 3);
  CHECK(descs.Get(1).dtype() == FLOAT16);
  ErrorCode code = ERROR_CODE_UNSPECIFIED;
  auto got = DecodeTensorDescs(descs, {48, 40, 1}, {}, &code);
  REQUIRE(got.ok());
  CHECK(code == ERROR_CODE_UNSPECIFIED);
  REQUIRE(got->size() == 3);
  CHECK((*got)[0].name == "input_ids");
  CHECK((*got)[0].dtype == odb::DType::kInt64);
  CHECK((*got)[0].shape == std::vector<int64_t>{5});
  CHECK((*got)[0].frame == 2);
  CHECK((*got)[0].size_bytes == 40);
  CHECK((*got)[1].numel == 24);
  CHECK((*got)[1].size_bytes == 48);
  CHECK((*got)[2].shape.empty());
  CHECK((*got)[2].numel == 1);
}

TEST_CASE("encode overwrites a reused description") {
  TensorDesc d = Desc("a", odb::DType::kInt32, {1, 2, 3}, 1);
  EncodeTensorDesc("b", odb::DType::kUInt8, {7}, 4, &d);
  CHECK(d.name() == "b");
  CHECK(d.shape_size() == 1);
  CHECK(d.frame() == 4);
}

TEST_CASE("zero-size tensors are valid") {
  auto got = DecodeTensorDescs(One(Desc("x", odb::DType::kFloat32, {0, 7}, 1)), {0});
  REQUIRE(got.ok());
  CHECK((*got)[0].numel == 0);
}

TEST_CASE("a shape whose element count wraps to 0 is refused, not read as empty") {
  // Regression (bug b): 2^40 x 2^40 wrapped to 0 and matched a 0-byte frame.
  const int64_t big = int64_t{1} << 40;
  const std::string why =
      Fails(One(Desc("x", odb::DType::kInt64, {big, big}, 1)), {0}, SHAPE_SIZE_MISMATCH);
  CHECK_THAT(why, Catch::Contains("'x'") && Catch::Contains("1099511627776") &&
                      Catch::Contains("overflows"));
}

TEST_CASE("a byte count that wraps is refused") {
  // 2^62 elements fit, x 8 bytes does not.
  TensorDescLimits limits;
  limits.max_dim = int64_t{1} << 62;
  const std::string why = Fails(One(Desc("x", odb::DType::kInt64, {int64_t{1} << 62}, 1)), {0},
                                SHAPE_SIZE_MISMATCH, limits);
  CHECK_THAT(why, Catch::Contains("byte size overflows"));
}

TEST_CASE("each malformed description gets a specific error") {
  SECTION("frame count") {
    CHECK_THAT(Fails(One(Desc("x", odb::DType::kUInt8, {1}, 1)), {1, 1}, FRAME_COUNT_MISMATCH),
               Catch::Contains("1 tensors") && Catch::Contains("2 payload frames"));
  }
  SECTION("empty name") {
    Fails(One(Desc("", odb::DType::kUInt8, {1}, 1)), {1}, MALFORMED_HEADER);
  }
  SECTION("long name") {
    const std::string why =
        Fails(One(Desc(std::string(300, 'n'), odb::DType::kUInt8, {1}, 1)), {1}, TOO_LARGE);
    CHECK_THAT(why, Catch::Contains("300 bytes") && Catch::Contains("256"));
    CHECK(why.size() < 200);  // the name is not echoed in full
  }
  SECTION("duplicate name") {
    Descs descs;
    *descs.Add() = Desc("x", odb::DType::kUInt8, {1}, 1);
    *descs.Add() = Desc("x", odb::DType::kUInt8, {1}, 2);
    CHECK_THAT(Fails(descs, {1, 1}, MALFORMED_HEADER), Catch::Contains("'x' appears twice"));
  }
  SECTION("duplicate name among many") {
    Descs descs;
    std::vector<size_t> sizes;
    for (uint32_t i = 0; i < 40; ++i) {
      *descs.Add() = Desc("t" + std::to_string(i % 39), odb::DType::kUInt8, {1}, i + 1);
      sizes.push_back(1);
    }
    CHECK_THAT(Fails(descs, sizes, MALFORMED_HEADER), Catch::Contains("'t0' appears twice"));
  }
  SECTION("unknown dtype") {
    TensorDesc d = Desc("x", odb::DType::kUInt8, {1}, 1);
    d.set_dtype(static_cast<DType>(77));
    CHECK_THAT(Fails(One(d), {1}, UNKNOWN_DTYPE), Catch::Contains("77"));
    d.set_dtype(DTYPE_UNSPECIFIED);
    Fails(One(d), {1}, UNKNOWN_DTYPE);
  }
  SECTION("frame out of range") {
    CHECK_THAT(Fails(One(Desc("x", odb::DType::kUInt8, {1}, 0)), {1}, FRAME_COUNT_MISMATCH),
               Catch::Contains("frame 0"));
    Fails(One(Desc("x", odb::DType::kUInt8, {1}, 2)), {1}, FRAME_COUNT_MISMATCH);
  }
  SECTION("frame reused, also beyond 64 frames") {
    for (uint32_t reused : {1u, 70u}) {
      Descs descs;
      std::vector<size_t> sizes(80, 1);
      for (uint32_t i = 1; i <= 80; ++i) {
        *descs.Add() = Desc("t" + std::to_string(i), odb::DType::kUInt8, {1}, i == 80 ? reused : i);
      }
      TensorDescLimits many;
      many.max_tensors = 128;
      CHECK_THAT(Fails(descs, sizes, FRAME_COUNT_MISMATCH, many),
                 Catch::Contains("reuses frame " + std::to_string(reused)));
    }
  }
  SECTION("more tensors than the limit: each costs bookkeeping beyond its bytes") {
    Descs descs;
    std::vector<size_t> sizes(65, 0);
    for (uint32_t i = 1; i <= 65; ++i) *descs.Add() = Desc("t" + std::to_string(i), odb::DType::kUInt8, {0}, i);
    CHECK_THAT(Fails(descs, sizes, TOO_LARGE), Catch::Contains("65 tensors, over the limit of 64"));
  }
  SECTION("rank over the limit") {
    CHECK_THAT(Fails(One(Desc("x", odb::DType::kUInt8, std::vector<int64_t>(9, 1), 1)), {1},
                     TOO_LARGE),
               Catch::Contains("rank 9"));
  }
  SECTION("negative or huge dim") {
    CHECK_THAT(Fails(One(Desc("x", odb::DType::kUInt8, {2, -1}, 1)), {0}, SHAPE_SIZE_MISMATCH),
               Catch::Contains("-1") && Catch::Contains("[2, -1]"));
    Fails(One(Desc("x", odb::DType::kUInt8, {(int64_t{1} << 40) + 1, 0}, 1)), {0},
          SHAPE_SIZE_MISMATCH);
  }
  SECTION("bytes differ from the frame") {
    CHECK_THAT(Fails(One(Desc("x", odb::DType::kInt64, {5}, 1)), {41}, SHAPE_SIZE_MISMATCH),
               Catch::Contains("tensor 'x' declares shape [5] of int64 = 40 bytes") &&
                   Catch::Contains("41 bytes"));
  }
}

TEST_CASE("the error code argument is optional") {
  auto got = DecodeTensorDescs(One(Desc("", odb::DType::kUInt8, {1}, 1)), {1});
  CHECK_FALSE(got.ok());
}

TEST_CASE("arena descriptions: offsets inside the block, aligned, lengths as the shape says") {
  // The block [4096, 4096 + 1024): two tensors at 64-byte aligned offsets.
  Descs descs;
  EncodeArenaTensorDesc("input_ids", odb::DType::kInt64, {5}, 4096, 40, descs.Add());
  EncodeArenaTensorDesc("pixels", odb::DType::kUInt8, {2, 100}, 4160, 200, descs.Add());
  auto got = DecodeArenaTensorDescs(descs, 4096, 1024);
  REQUIRE(got.ok());
  CHECK((*got)[0].offset == 4096);
  CHECK((*got)[0].frame == 0);
  CHECK((*got)[1].size_bytes == 200);

  auto fails = [](const Descs& d, ErrorCode expected, uint64_t block_offset = 4096, uint64_t block_length = 1024) {
    ErrorCode code = ERROR_CODE_UNSPECIFIED;
    auto r = DecodeArenaTensorDescs(d, block_offset, block_length, {}, &code);
    REQUIRE_FALSE(r.ok());
    CHECK(code == expected);
    return std::string(r.status().message());
  };
  Descs one;
  SECTION("before the block") {
    EncodeArenaTensorDesc("x", odb::DType::kUInt8, {64}, 4032, 64, one.Add());
    CHECK_THAT(fails(one, INVALID_ARENA_BLOCK), Catch::Contains("lies outside its arena block [4096, +1024)"));
  }
  SECTION("past the block's end") {
    EncodeArenaTensorDesc("x", odb::DType::kUInt8, {128}, 4096 + 960, 128, one.Add());
    CHECK_THAT(fails(one, INVALID_ARENA_BLOCK), Catch::Contains("outside"));
  }
  SECTION("offsets and lengths that wrap") {
    EncodeArenaTensorDesc("x", odb::DType::kUInt8, {64}, ~uint64_t{0} - 63, 64, one.Add());
    fails(one, INVALID_ARENA_BLOCK);
    Descs two;
    EncodeArenaTensorDesc("y", odb::DType::kUInt8, {1}, 4096, ~uint64_t{0}, two.Add());
    fails(two, INVALID_ARENA_BLOCK, 4096, ~uint64_t{0} - 4096);  // the length wins over the shape
  }
  SECTION("misaligned") {
    EncodeArenaTensorDesc("x", odb::DType::kUInt8, {8}, 4104, 8, one.Add());
    CHECK_THAT(fails(one, INVALID_ARENA_BLOCK), Catch::Contains("64-byte aligned"));
  }
  SECTION("a length other than the shape's") {
    EncodeArenaTensorDesc("x", odb::DType::kInt64, {5}, 4096, 48, one.Add());
    CHECK_THAT(fails(one, SHAPE_SIZE_MISMATCH), Catch::Contains("= 40 bytes, but its arena range has 48 bytes"));
  }
  SECTION("a frame index as well") {
    EncodeArenaTensorDesc("x", odb::DType::kUInt8, {8}, 4096, 8, one.Add());
    one.Mutable(0)->set_frame(1);
    fails(one, FRAME_COUNT_MISMATCH);
  }
}

}  // namespace
}  // namespace odb::wire
