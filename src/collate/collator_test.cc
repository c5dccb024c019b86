#include "src/collate/collator.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "src/common/dtype.h"
#include "src/common/sample.h"

namespace odb::collate {
namespace {

// Owns the bytes behind a test sample's tensor views, as the ingest adapter's
// zmq::message_t holder does in the daemon.
class VectorFrame : public FrameHolder {
 public:
  explicit VectorFrame(std::vector<uint8_t> bytes) : bytes_(std::move(bytes)) {}
  const std::vector<uint8_t>& bytes() const { return bytes_; }

 private:
  std::vector<uint8_t> bytes_;
};

template <typename T>
std::vector<uint8_t> Bytes(const std::vector<T>& values) {
  std::vector<uint8_t> out(values.size() * sizeof(T));
  if (!out.empty()) std::memcpy(out.data(), values.data(), out.size());
  return out;
}

class SampleBuilder {
 public:
  explicit SampleBuilder(uint64_t id) { sample_.meta.id = id; }

  template <typename T>
  SampleBuilder& Add(const std::string& name, DType dtype, std::vector<int64_t> shape,
                     const std::vector<T>& values) {
    return AddRaw(name, dtype, std::move(shape), Bytes(values));
  }

  // `size_override` lets a test lie about size_bytes.
  SampleBuilder& AddRaw(const std::string& name, DType dtype, std::vector<int64_t> shape,
                        std::vector<uint8_t> bytes,
                        std::optional<size_t> size_override = std::nullopt) {
    auto frame = std::make_shared<VectorFrame>(std::move(bytes));
    TensorView view;
    view.name = name;
    view.dtype = dtype;
    view.shape = std::move(shape);
    view.data = frame->bytes().data();
    view.size_bytes = size_override.value_or(frame->bytes().size());
    sample_.tensors.push_back(std::move(view));
    sample_.frames.push_back(std::move(frame));
    return *this;
  }

  Sample Build() { return std::move(sample_); }

 private:
  Sample sample_;
};

std::vector<const Sample*> Ptrs(const std::vector<Sample>& samples) {
  std::vector<const Sample*> out;
  for (const Sample& s : samples) out.push_back(&s);
  return out;
}

std::vector<std::string> Names(const std::vector<BatchTensor>& tensors) {
  std::vector<std::string> out;
  for (const BatchTensor& t : tensors) out.push_back(t.name);
  return out;
}

const BatchTensor& Get(const std::vector<BatchTensor>& tensors, const std::string& name) {
  for (const BatchTensor& t : tensors) {
    if (t.name == name) return t;
  }
  FAIL("no output tensor named " << name);
  static BatchTensor never;
  return never;
}

template <typename T>
void CheckTensor(const BatchTensor& t, DType dtype, std::vector<int64_t> shape,
                 const std::vector<T>& values) {
  INFO("tensor " << t.name);
  CHECK(t.dtype == dtype);
  CHECK(t.shape == shape);
  CHECK(t.bytes == Bytes(values));
}

CollateOptions Options(std::vector<FieldSpec> fields, bool attention_mask = false) {
  CollateOptions options;
  options.fields = std::move(fields);
  options.attention_mask = attention_mask;
  return options;
}

TEST_CASE("pad right int64 with a non-zero pad value, with attention mask") {
  std::vector<Sample> s;
  s.push_back(SampleBuilder(11).Add<int64_t>("input_ids", DType::kInt64, {3}, {1, 2, 3}).Build());
  s.push_back(SampleBuilder(12).Add<int64_t>("input_ids", DType::kInt64, {1}, {4}).Build());
  s.push_back(SampleBuilder(13).Add<int64_t>("input_ids", DType::kInt64, {2}, {5, 6}).Build());
  auto out = Collate(Ptrs(s), Options({{"input_ids", FieldRule::kPad, -100, PadSide::kRight}},
                                      /*attention_mask=*/true));
  REQUIRE(out.ok());
  CHECK(Names(*out) == std::vector<std::string>{"input_ids", "attention_mask"});
  CheckTensor<int64_t>((*out)[0], DType::kInt64, {3, 3},
                       {1, 2, 3, 4, -100, -100, 5, 6, -100});
  CheckTensor<int64_t>((*out)[1], DType::kInt64, {3, 3}, {1, 1, 1, 1, 0, 0, 1, 1, 0});
}

TEST_CASE("pad left int64, attention mask follows the pad side") {
  std::vector<Sample> s;
  s.push_back(SampleBuilder(11).Add<int64_t>("input_ids", DType::kInt64, {3}, {1, 2, 3}).Build());
  s.push_back(SampleBuilder(12).Add<int64_t>("input_ids", DType::kInt64, {1}, {4}).Build());
  s.push_back(SampleBuilder(13).Add<int64_t>("input_ids", DType::kInt64, {2}, {5, 6}).Build());
  auto out = Collate(Ptrs(s), Options({{"input_ids", FieldRule::kPad, 7, PadSide::kLeft}},
                                      /*attention_mask=*/true));
  REQUIRE(out.ok());
  CheckTensor<int64_t>(Get(*out, "input_ids"), DType::kInt64, {3, 3}, {1, 2, 3, 7, 7, 4, 7, 5, 6});
  CheckTensor<int64_t>(Get(*out, "attention_mask"), DType::kInt64, {3, 3},
                       {1, 1, 1, 0, 0, 1, 0, 1, 1});
}

TEST_CASE("pad float32 with trailing dims, both sides") {
  std::vector<Sample> s;
  s.push_back(SampleBuilder(1).Add<float>("x", DType::kFloat32, {2, 2}, {1, 2, 3, 4}).Build());
  s.push_back(SampleBuilder(2).Add<float>("x", DType::kFloat32, {1, 2}, {5, 6}).Build());
  SECTION("right") {
    auto out = Collate(Ptrs(s), Options({{"x", FieldRule::kPad, 0.5, PadSide::kRight}}));
    REQUIRE(out.ok());
    REQUIRE(out->size() == 1);
    CheckTensor<float>((*out)[0], DType::kFloat32, {2, 2, 2}, {1, 2, 3, 4, 5, 6, 0.5f, 0.5f});
  }
  SECTION("left") {
    auto out = Collate(Ptrs(s), Options({{"x", FieldRule::kPad, -0.25, PadSide::kLeft}}));
    REQUIRE(out.ok());
    CheckTensor<float>((*out)[0], DType::kFloat32, {2, 2, 2},
                       {1, 2, 3, 4, -0.25f, -0.25f, 5, 6});
  }
}

TEST_CASE("pad float16 and bfloat16 convert the pad value") {
  std::vector<Sample> s;
  s.push_back(SampleBuilder(1)
                  .Add<uint16_t>("h", DType::kFloat16, {3}, {0x3C00, 0x4000, 0x4200})
                  .Add<uint16_t>("b", DType::kBFloat16, {1}, {0x4000})
                  .Build());
  s.push_back(SampleBuilder(2)
                  .Add<uint16_t>("h", DType::kFloat16, {1}, {0x3C00})
                  .Add<uint16_t>("b", DType::kBFloat16, {2}, {0x4040, 0x4080})
                  .Build());
  auto out = Collate(Ptrs(s), Options({{"h", FieldRule::kPad, -2.5, PadSide::kRight},
                                       {"b", FieldRule::kPad, 1.0, PadSide::kLeft}}));
  REQUIRE(out.ok());
  CHECK(Names(*out) == std::vector<std::string>{"b", "h"});
  // -2.5 = 0xC100 in float16; 1.0 = 0x3F80 in bfloat16.
  CheckTensor<uint16_t>(Get(*out, "h"), DType::kFloat16, {2, 3},
                        {0x3C00, 0x4000, 0x4200, 0x3C00, 0xC100, 0xC100});
  CheckTensor<uint16_t>(Get(*out, "b"), DType::kBFloat16, {2, 2}, {0x3F80, 0x4000, 0x4040, 0x4080});
}

TEST_CASE("pad bool right and left with true") {
  std::vector<Sample> s;
  s.push_back(SampleBuilder(1).Add<uint8_t>("m", DType::kBool, {1}, {0}).Build());
  s.push_back(SampleBuilder(2).Add<uint8_t>("m", DType::kBool, {3}, {1, 0, 1}).Build());
  auto right = Collate(Ptrs(s), Options({{"m", FieldRule::kPad, 1, PadSide::kRight}}));
  REQUIRE(right.ok());
  CheckTensor<uint8_t>((*right)[0], DType::kBool, {2, 3}, {0, 1, 1, 1, 0, 1});
  auto left = Collate(Ptrs(s), Options({{"m", FieldRule::kPad, 1, PadSide::kLeft}}));
  REQUIRE(left.ok());
  CheckTensor<uint8_t>((*left)[0], DType::kBool, {2, 3}, {1, 1, 0, 1, 0, 1});
}

// The bytes of one pad element, read back from a padded [2, 1] output whose
// second sample is empty.
std::vector<uint8_t> PadElement(DType dtype, double value) {
  const size_t elem = DTypeSize(dtype);
  std::vector<Sample> s;
  s.push_back(SampleBuilder(1).AddRaw("x", dtype, {1}, std::vector<uint8_t>(elem, 0)).Build());
  s.push_back(SampleBuilder(2).AddRaw("x", dtype, {0}, {}).Build());
  auto out = Collate(Ptrs(s), Options({{"x", FieldRule::kPad, value, PadSide::kRight}}));
  REQUIRE(out.ok());
  REQUIRE((*out)[0].bytes.size() == 2 * elem);
  return std::vector<uint8_t>((*out)[0].bytes.begin() + elem, (*out)[0].bytes.end());
}

TEST_CASE("pad value conversion for every dtype") {
  CHECK(PadElement(DType::kUInt8, 200) == Bytes<uint8_t>({200}));
  CHECK(PadElement(DType::kInt8, -5) == Bytes<int8_t>({-5}));
  CHECK(PadElement(DType::kInt16, -2) == Bytes<int16_t>({-2}));
  CHECK(PadElement(DType::kInt32, 123456) == Bytes<int32_t>({123456}));
  CHECK(PadElement(DType::kInt64, -100) == Bytes<int64_t>({-100}));
  CHECK(PadElement(DType::kInt64, -9223372036854775808.0) ==
        Bytes<int64_t>({std::numeric_limits<int64_t>::min()}));
  CHECK(PadElement(DType::kFloat32, 0.1) == Bytes<float>({0.1f}));
  CHECK(PadElement(DType::kFloat64, 0.1) == Bytes<double>({0.1}));
  CHECK(PadElement(DType::kBool, 1) == Bytes<uint8_t>({1}));
  CHECK(PadElement(DType::kBool, 0) == Bytes<uint8_t>({0}));

  // float16: normal, largest finite, subnormal, ties to even, underflow, signs.
  CHECK(PadElement(DType::kFloat16, -2.5) == Bytes<uint16_t>({0xC100}));
  CHECK(PadElement(DType::kFloat16, 0.1) == Bytes<uint16_t>({0x2E66}));
  CHECK(PadElement(DType::kFloat16, 65504) == Bytes<uint16_t>({0x7BFF}));
  CHECK(PadElement(DType::kFloat16, std::ldexp(1.0, -24)) == Bytes<uint16_t>({0x0001}));
  CHECK(PadElement(DType::kFloat16, std::ldexp(1.0, -14)) == Bytes<uint16_t>({0x0400}));
  CHECK(PadElement(DType::kFloat16, 1 + std::ldexp(1.0, -11)) == Bytes<uint16_t>({0x3C00}));
  CHECK(PadElement(DType::kFloat16, 1 + 3 * std::ldexp(1.0, -11)) == Bytes<uint16_t>({0x3C02}));
  CHECK(PadElement(DType::kFloat16, 1e-8) == Bytes<uint16_t>({0x0000}));
  CHECK(PadElement(DType::kFloat16, -0.0) == Bytes<uint16_t>({0x8000}));
  CHECK(PadElement(DType::kFloat16, -INFINITY) == Bytes<uint16_t>({0xFC00}));
  CHECK(PadElement(DType::kFloat16, NAN) == Bytes<uint16_t>({0x7E00}));

  // bfloat16: 1/3 = 0x3EAAAAAB as float32 rounds up to 0x3EAB.
  CHECK(PadElement(DType::kBFloat16, 1.0) == Bytes<uint16_t>({0x3F80}));
  CHECK(PadElement(DType::kBFloat16, -2.0) == Bytes<uint16_t>({0xC000}));
  CHECK(PadElement(DType::kBFloat16, 1.0 / 3.0) == Bytes<uint16_t>({0x3EAB}));
  CHECK(PadElement(DType::kBFloat16, 3.0e38) == Bytes<uint16_t>({0x7F62}));
}

TEST_CASE("stack tensors and scalars") {
  std::vector<Sample> s;
  for (uint64_t id = 1; id <= 3; ++id) {
    const auto v = static_cast<int32_t>(id * 10);
    s.push_back(SampleBuilder(id)
                    .Add<int32_t>("mat", DType::kInt32, {2, 2}, {v, v + 1, v + 2, v + 3})
                    .Add<float>("loss_weight", DType::kFloat32, {}, {static_cast<float>(id) / 2})
                    .Build());
  }
  auto out = Collate(Ptrs(s), Options({{"mat", FieldRule::kStack},
                                       {"loss_weight", FieldRule::kStack}}));
  REQUIRE(out.ok());
  CHECK(Names(*out) == std::vector<std::string>{"loss_weight", "mat"});
  CheckTensor<float>((*out)[0], DType::kFloat32, {3}, {0.5f, 1.0f, 1.5f});
  CheckTensor<int32_t>((*out)[1], DType::kInt32, {3, 2, 2},
                       {10, 11, 12, 13, 20, 21, 22, 23, 30, 31, 32, 33});
}

TEST_CASE("concat with offsets, output order with derived tensors") {
  std::vector<Sample> s;
  s.push_back(SampleBuilder(1)
                  .Add<int64_t>("input_ids", DType::kInt64, {2}, {1, 2})
                  .Add<uint8_t>("pixels", DType::kUInt8, {2, 3}, {1, 2, 3, 4, 5, 6})
                  .Build());
  s.push_back(SampleBuilder(2)
                  .Add<uint8_t>("pixels", DType::kUInt8, {1, 3}, {7, 8, 9})
                  .Add<int64_t>("input_ids", DType::kInt64, {1}, {3})
                  .Build());
  s.push_back(SampleBuilder(3)
                  .Add<int64_t>("input_ids", DType::kInt64, {2}, {4, 5})
                  .AddRaw("pixels", DType::kUInt8, {0, 3}, {})
                  .Build());
  CollateOptions options = Options({{"pixels", FieldRule::kConcat}}, /*attention_mask=*/true);
  auto out = Collate(Ptrs(s), options);
  REQUIRE(out.ok());
  CHECK(Names(*out) ==
        std::vector<std::string>{"input_ids", "pixels", "pixels_offsets", "attention_mask"});
  CheckTensor<int64_t>((*out)[0], DType::kInt64, {3, 2}, {1, 2, 3, 0, 4, 5});
  CheckTensor<uint8_t>((*out)[1], DType::kUInt8, {3, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9});
  CheckTensor<int64_t>((*out)[2], DType::kInt64, {4}, {0, 2, 3, 3});
  CheckTensor<int64_t>((*out)[3], DType::kInt64, {3, 2}, {1, 1, 1, 0, 1, 1});
}

TEST_CASE("packed mode: one row, cu_seqlens, position_ids, no mask") {
  std::vector<Sample> s;
  const std::vector<std::vector<int64_t>> ids = {{1, 2, 3}, {4}, {5, 6}};
  for (size_t i = 0; i < ids.size(); ++i) {
    const auto n = static_cast<int64_t>(ids[i].size());
    std::vector<int64_t> labels = ids[i];
    for (auto& l : labels) l += 100;
    s.push_back(SampleBuilder(i + 1)
                    .Add<int64_t>("input_ids", DType::kInt64, {n}, ids[i])
                    .Add<int64_t>("labels", DType::kInt64, {n}, labels)
                    .Add<uint8_t>("image", DType::kUInt8, {1, 2},
                                  {static_cast<uint8_t>(i), static_cast<uint8_t>(i + 10)})
                    .Add<float>("weight", DType::kFloat32, {}, {1.0f})
                    .Build());
  }
  CollateOptions options = Options({{"image", FieldRule::kConcat},
                                    {"weight", FieldRule::kStack},
                                    {"labels", FieldRule::kPad, -100, PadSide::kLeft}},
                                   /*attention_mask=*/true);
  options.packed = true;
  auto out = Collate(Ptrs(s), options);
  REQUIRE(out.ok());
  CHECK(Names(*out) == std::vector<std::string>{"image", "image_offsets", "input_ids", "labels",
                                                "weight", "cu_seqlens", "position_ids"});
  CheckTensor<uint8_t>(Get(*out, "image"), DType::kUInt8, {3, 2}, {0, 10, 1, 11, 2, 12});
  CheckTensor<int64_t>(Get(*out, "image_offsets"), DType::kInt64, {4}, {0, 1, 2, 3});
  CheckTensor<int64_t>(Get(*out, "input_ids"), DType::kInt64, {1, 6}, {1, 2, 3, 4, 5, 6});
  CheckTensor<int64_t>(Get(*out, "labels"), DType::kInt64, {1, 6},
                       {101, 102, 103, 104, 105, 106});
  CheckTensor<float>(Get(*out, "weight"), DType::kFloat32, {3}, {1.0f, 1.0f, 1.0f});
  CheckTensor<int32_t>(Get(*out, "cu_seqlens"), DType::kInt32, {4}, {0, 3, 4, 6});
  CheckTensor<int64_t>(Get(*out, "position_ids"), DType::kInt64, {1, 6}, {0, 1, 2, 0, 0, 1});
}

TEST_CASE("FieldSpecs for absent tensors are ignored; the default rule applies to the rest") {
  std::vector<Sample> s;
  s.push_back(SampleBuilder(1).Add<int32_t>("a", DType::kInt32, {2}, {1, 2}).Build());
  s.push_back(SampleBuilder(2).Add<int32_t>("a", DType::kInt32, {1}, {3}).Build());
  CollateOptions options = Options({{"not_here", FieldRule::kStack}});
  options.default_rule = FieldRule::kConcat;
  auto out = Collate(Ptrs(s), options);
  REQUIRE(out.ok());
  CHECK(Names(*out) == std::vector<std::string>{"a", "a_offsets"});
  CheckTensor<int32_t>((*out)[0], DType::kInt32, {3}, {1, 2, 3});
}

// ---------------------------------------------------------------------------
// Randomized property: unpadding the padded output gives back every sample's
// bytes exactly, padding holds the pad element, the mask marks real tokens,
// and packed output is the concatenation indexed by cu_seqlens.

struct DTypeCase {
  DType dtype;
  double pad;
  std::vector<uint8_t> pad_bytes;
};

std::vector<DTypeCase> DTypeCases() {
  return {
      {DType::kUInt8, 3, Bytes<uint8_t>({3})},
      {DType::kInt8, -1, Bytes<int8_t>({-1})},
      {DType::kInt16, -300, Bytes<int16_t>({-300})},
      {DType::kInt32, 70000, Bytes<int32_t>({70000})},
      {DType::kInt64, -100, Bytes<int64_t>({-100})},
      {DType::kFloat16, -1.5, Bytes<uint16_t>({0xBE00})},
      {DType::kBFloat16, 7, Bytes<uint16_t>({0x40E0})},
      {DType::kFloat32, 2.5, Bytes<float>({2.5f})},
      {DType::kFloat64, -0.125, Bytes<double>({-0.125})},
      {DType::kBool, 1, Bytes<uint8_t>({1})},
  };
}

TEST_CASE("randomized: unpadding the padded result returns each sample's bytes") {
  const std::vector<DTypeCase> cases = DTypeCases();
  for (uint32_t seed = 1; seed <= 300; ++seed) {
    INFO("seed " << seed);
    std::mt19937 rng(seed);
    auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
    const DTypeCase& c = cases[static_cast<size_t>(uniform(0, static_cast<int>(cases.size()) - 1))];
    const size_t elem = DTypeSize(c.dtype);
    const size_t batch = static_cast<size_t>(uniform(1, 6));
    std::vector<int64_t> trailing(static_cast<size_t>(uniform(0, 2)));
    for (auto& d : trailing) d = uniform(1, 3);
    size_t row = elem;
    for (int64_t d : trailing) row *= static_cast<size_t>(d);
    const PadSide side = uniform(0, 1) == 0 ? PadSide::kRight : PadSide::kLeft;

    std::vector<Sample> samples;
    std::vector<int64_t> lengths;
    std::vector<int64_t> extra_lengths;
    for (size_t i = 0; i < batch; ++i) {
      const int64_t len = uniform(0, 9);
      const int64_t extra_len = uniform(0, 4);
      std::vector<int64_t> shape = {len};
      shape.insert(shape.end(), trailing.begin(), trailing.end());
      std::vector<uint8_t> data(static_cast<size_t>(len) * row);
      for (auto& b : data) b = static_cast<uint8_t>(c.dtype == DType::kBool ? uniform(0, 1)
                                                                            : uniform(0, 255));
      std::vector<int32_t> extra(static_cast<size_t>(extra_len));
      for (auto& e : extra) e = uniform(-1000, 1000);
      samples.push_back(SampleBuilder(1000 + i)
                            .AddRaw("input_ids", c.dtype, shape, std::move(data))
                            .Add<int32_t>("extra", DType::kInt32, {extra_len}, extra)
                            .Build());
      lengths.push_back(len);
      extra_lengths.push_back(extra_len);
    }
    const int64_t lmax = *std::max_element(lengths.begin(), lengths.end());
    CollateOptions options = Options({{"input_ids", FieldRule::kPad, c.pad, side},
                                      {"extra", FieldRule::kConcat}},
                                     /*attention_mask=*/true);
    auto out = Collate(Ptrs(samples), options);
    REQUIRE(out.ok());
    REQUIRE(Names(*out) ==
            std::vector<std::string>{"extra", "extra_offsets", "input_ids", "attention_mask"});

    // Concat: offsets are prefix sums and each slice is the sample's bytes.
    const BatchTensor& extra = (*out)[0];
    const BatchTensor& offsets = (*out)[1];
    REQUIRE(offsets.bytes.size() == (batch + 1) * sizeof(int64_t));
    std::vector<int64_t> off(batch + 1);
    std::memcpy(off.data(), offsets.bytes.data(), offsets.bytes.size());
    CHECK(off[0] == 0);
    for (size_t i = 0; i < batch; ++i) {
      CHECK(off[i + 1] - off[i] == extra_lengths[i]);
      const TensorView& v = samples[i].tensors[1];
      REQUIRE(extra.bytes.size() >= static_cast<size_t>(off[i + 1]) * 4);
      CHECK(std::vector<uint8_t>(extra.bytes.begin() + off[i] * 4,
                                 extra.bytes.begin() + off[i + 1] * 4) ==
            std::vector<uint8_t>(v.data, v.data + v.size_bytes));
    }

    // Pad: unpad each row.
    const BatchTensor& padded = (*out)[2];
    std::vector<int64_t> expected_shape = {static_cast<int64_t>(batch), lmax};
    expected_shape.insert(expected_shape.end(), trailing.begin(), trailing.end());
    REQUIRE(padded.shape == expected_shape);
    REQUIRE(padded.bytes.size() == batch * static_cast<size_t>(lmax) * row);
    const BatchTensor& mask = (*out)[3];
    REQUIRE(mask.shape == std::vector<int64_t>{static_cast<int64_t>(batch), lmax});
    for (size_t i = 0; i < batch; ++i) {
      const size_t row_start = i * static_cast<size_t>(lmax) * row;
      const size_t real = static_cast<size_t>(lengths[i]) * row;
      const size_t pad = static_cast<size_t>(lmax) * row - real;
      const size_t real_start = row_start + (side == PadSide::kLeft ? pad : 0);
      const size_t pad_start = row_start + (side == PadSide::kLeft ? 0 : real);
      const TensorView& v = samples[i].tensors[0];
      CHECK(std::vector<uint8_t>(padded.bytes.begin() + real_start,
                                 padded.bytes.begin() + real_start + real) ==
            std::vector<uint8_t>(v.data, v.data + v.size_bytes));
      for (size_t k = 0; k < pad; k += elem) {
        REQUIRE(std::equal(c.pad_bytes.begin(), c.pad_bytes.end(),
                           padded.bytes.begin() + pad_start + k));
      }
      for (int64_t j = 0; j < lmax; ++j) {
        int64_t m = 0;
        std::memcpy(&m, mask.bytes.data() + (i * lmax + j) * 8, 8);
        const bool is_real = side == PadSide::kRight ? j < lengths[i] : j >= lmax - lengths[i];
        REQUIRE(m == (is_real ? 1 : 0));
      }
    }

    // Packed: the same group as one row.
    options.packed = true;
    auto packed = Collate(Ptrs(samples), options);
    REQUIRE(packed.ok());
    REQUIRE(Names(*packed) == std::vector<std::string>{"extra", "extra_offsets", "input_ids",
                                                       "cu_seqlens", "position_ids"});
    std::vector<uint8_t> concatenated;
    std::vector<int32_t> cu = {0};
    std::vector<int64_t> positions;
    for (size_t i = 0; i < batch; ++i) {
      const TensorView& v = samples[i].tensors[0];
      concatenated.insert(concatenated.end(), v.data, v.data + v.size_bytes);
      cu.push_back(cu.back() + static_cast<int32_t>(lengths[i]));
      for (int64_t j = 0; j < lengths[i]; ++j) positions.push_back(j);
    }
    std::vector<int64_t> packed_shape = {1, cu.back()};
    packed_shape.insert(packed_shape.end(), trailing.begin(), trailing.end());
    CHECK((*packed)[2].shape == packed_shape);
    CHECK((*packed)[2].bytes == concatenated);
    CheckTensor<int32_t>((*packed)[3], DType::kInt32, {static_cast<int64_t>(batch) + 1}, cu);
    CheckTensor<int64_t>((*packed)[4], DType::kInt64, {1, cu.back()}, positions);
  }
}

// ---------------------------------------------------------------------------
// Errors: each names the field and the sample id.

void CheckError(const absl::StatusOr<std::vector<BatchTensor>>& result,
                const std::vector<std::string>& fragments) {
  REQUIRE_FALSE(result.ok());
  CHECK(result.status().code() == absl::StatusCode::kInvalidArgument);
  const std::string message(result.status().message());
  INFO("message: " << message);
  for (const std::string& fragment : fragments) {
    CHECK(message.find(fragment) != std::string::npos);
  }
}

// Two samples (ids 1 and 2) with "input_ids" int64 and "labels" int64.
std::vector<Sample> TwoSamples() {
  std::vector<Sample> s;
  s.push_back(SampleBuilder(1)
                  .Add<int64_t>("input_ids", DType::kInt64, {2}, {1, 2})
                  .Add<int64_t>("labels", DType::kInt64, {2}, {1, 2})
                  .Build());
  s.push_back(SampleBuilder(2)
                  .Add<int64_t>("input_ids", DType::kInt64, {1}, {3})
                  .Add<int64_t>("labels", DType::kInt64, {1}, {3})
                  .Build());
  return s;
}

TEST_CASE("error: empty group") {
  CheckError(Collate({}, CollateOptions{}), {"empty group"});
}

TEST_CASE("error: a sample misses a field the first sample has") {
  std::vector<Sample> s = TwoSamples();
  s[1].tensors.pop_back();
  CheckError(Collate(Ptrs(s), CollateOptions{}), {"'labels'", "sample 2", "missing", "sample 1"});
}

TEST_CASE("error: a sample carries an extra field") {
  std::vector<Sample> s = TwoSamples();
  s[1] = SampleBuilder(2)
             .Add<int64_t>("input_ids", DType::kInt64, {1}, {3})
             .Add<int64_t>("labels", DType::kInt64, {1}, {3})
             .Add<int64_t>("surprise", DType::kInt64, {1}, {3})
             .Build();
  CheckError(Collate(Ptrs(s), CollateOptions{}), {"'surprise'", "sample 2", "sample 1"});
}

TEST_CASE("error: a tensor name appears twice in one sample") {
  std::vector<Sample> s = TwoSamples();
  s[1] = SampleBuilder(2)
             .Add<int64_t>("input_ids", DType::kInt64, {1}, {3})
             .Add<int64_t>("labels", DType::kInt64, {1}, {3})
             .Add<int64_t>("labels", DType::kInt64, {1}, {3})
             .Build();
  CheckError(Collate(Ptrs(s), CollateOptions{}), {"'labels'", "sample 2", "twice"});
}

TEST_CASE("error: dtype mismatch") {
  std::vector<Sample> s = TwoSamples();
  s[1] = SampleBuilder(2)
             .Add<int64_t>("input_ids", DType::kInt64, {1}, {3})
             .Add<int32_t>("labels", DType::kInt32, {1}, {3})
             .Build();
  CheckError(Collate(Ptrs(s), CollateOptions{}), {"'labels'", "sample 2", "int32", "int64"});
}

TEST_CASE("error: invalid dtype") {
  std::vector<Sample> s = TwoSamples();
  s[1].tensors[1].dtype = static_cast<DType>(42);
  CheckError(Collate(Ptrs(s), CollateOptions{}), {"'labels'", "sample 2", "invalid dtype"});
}

TEST_CASE("error: size_bytes does not match numel x dtype size") {
  std::vector<Sample> s = TwoSamples();
  s[1] = SampleBuilder(2)
             .Add<int64_t>("input_ids", DType::kInt64, {1}, {3})
             .AddRaw("labels", DType::kInt64, {2}, Bytes<int64_t>({3, 4}), /*size_override=*/12)
             .Build();
  CheckError(Collate(Ptrs(s), CollateOptions{}), {"'labels'", "sample 2", "size_bytes 12"});
}

TEST_CASE("error: pad trailing-dim mismatch") {
  std::vector<Sample> s;
  s.push_back(SampleBuilder(1).Add<float>("x", DType::kFloat32, {1, 2}, {1, 2}).Build());
  s.push_back(SampleBuilder(2).Add<float>("x", DType::kFloat32, {1, 3}, {1, 2, 3}).Build());
  CheckError(Collate(Ptrs(s), Options({{"x", FieldRule::kPad}})),
             {"'x'", "sample 2", "[1, 3]", "[1, 2]", "trailing"});
}

TEST_CASE("error: concat trailing-dim mismatch (rank differs)") {
  std::vector<Sample> s;
  s.push_back(SampleBuilder(1).Add<float>("x", DType::kFloat32, {1, 2}, {1, 2}).Build());
  s.push_back(SampleBuilder(2).Add<float>("x", DType::kFloat32, {2}, {1, 2}).Build());
  CheckError(Collate(Ptrs(s), Options({{"x", FieldRule::kConcat}})),
             {"'x'", "sample 2", "concat", "trailing"});
}

TEST_CASE("error: stack shape mismatch") {
  std::vector<Sample> s;
  s.push_back(SampleBuilder(7).Add<float>("x", DType::kFloat32, {2}, {1, 2}).Build());
  s.push_back(SampleBuilder(9).Add<float>("x", DType::kFloat32, {3}, {1, 2, 3}).Build());
  CheckError(Collate(Ptrs(s), Options({{"x", FieldRule::kStack}})),
             {"'x'", "sample 9", "sample 7", "stack", "identical"});
}

TEST_CASE("error: padding a scalar") {
  std::vector<Sample> s;
  s.push_back(SampleBuilder(5).Add<float>("score", DType::kFloat32, {}, {1}).Build());
  CheckError(Collate(Ptrs(s), Options({})), {"'score'", "sample 5", "scalar", "stack"});
}

TEST_CASE("error: length_field missing for the attention mask") {
  std::vector<Sample> s;
  s.push_back(SampleBuilder(3).Add<int64_t>("tokens", DType::kInt64, {2}, {1, 2}).Build());
  CheckError(Collate(Ptrs(s), Options({}, /*attention_mask=*/true)),
             {"'input_ids'", "sample 3", "length_field", "attention_mask"});
}

TEST_CASE("error: length_field missing in packed mode") {
  std::vector<Sample> s;
  s.push_back(SampleBuilder(3).Add<int64_t>("tokens", DType::kInt64, {2}, {1, 2}).Build());
  CollateOptions options = Options({});
  options.packed = true;
  options.length_field = "ids";
  CheckError(Collate(Ptrs(s), options), {"'ids'", "sample 3", "length_field", "packed"});
}

TEST_CASE("error: packed field length differs from the length field") {
  std::vector<Sample> s = TwoSamples();
  s[1] = SampleBuilder(2)
             .Add<int64_t>("input_ids", DType::kInt64, {1}, {3})
             .Add<int64_t>("labels", DType::kInt64, {2}, {3, 4})
             .Build();
  CollateOptions options;
  options.packed = true;
  CheckError(Collate(Ptrs(s), options), {"'labels'", "sample 2", "'input_ids'", "concat"});
}

TEST_CASE("error: a field clashes with a derived tensor name") {
  std::vector<Sample> s;
  s.push_back(SampleBuilder(4)
                  .Add<int64_t>("input_ids", DType::kInt64, {2}, {1, 2})
                  .Add<int64_t>("attention_mask", DType::kInt64, {2}, {1, 1})
                  .Build());
  CheckError(Collate(Ptrs(s), CollateOptions{}), {"'attention_mask'", "sample 4", "clashes"});
}

TEST_CASE("error: pad value not representable in the field dtype") {
  std::vector<Sample> s = TwoSamples();
  CheckError(Collate(Ptrs(s), Options({{"labels", FieldRule::kPad, 0.5}})),
             {"'labels'", "pad_value 0.5", "int64"});
  std::vector<Sample> h;
  h.push_back(SampleBuilder(1).Add<uint16_t>("h", DType::kFloat16, {1}, {0}).Build());
  CheckError(Collate(Ptrs(h), Options({{"h", FieldRule::kPad, 70000}})),
             {"'h'", "pad_value 70000", "float16"});
  std::vector<Sample> b;
  b.push_back(SampleBuilder(1).Add<uint8_t>("m", DType::kBool, {1}, {0}).Build());
  CheckError(Collate(Ptrs(b), Options({{"m", FieldRule::kPad, 2}})), {"'m'", "bool", "0 or 1"});
}

TEST_CASE("error: a FieldSpec listed twice") {
  std::vector<Sample> s = TwoSamples();
  CheckError(Collate(Ptrs(s), Options({{"labels", FieldRule::kPad}, {"labels", FieldRule::kStack}})),
             {"'labels'", "twice"});
}

// Collate must return errors, never throw: the daemon calls it on its
// serving thread, and an exception there is a crash for every producer.
absl::StatusOr<std::vector<BatchTensor>> CollateNoThrow(const std::vector<const Sample*>& group,
                                                        const CollateOptions& options) {
  std::optional<absl::StatusOr<std::vector<BatchTensor>>> result;
  REQUIRE_NOTHROW(result.emplace(Collate(group, options)));
  return std::move(*result);
}

void CheckResourceError(const absl::StatusOr<std::vector<BatchTensor>>& result,
                        const std::vector<std::string>& fragments) {
  REQUIRE_FALSE(result.ok());
  CHECK(result.status().code() == absl::StatusCode::kResourceExhausted);
  const std::string message(result.status().message());
  INFO("message: " << message);
  for (const std::string& fragment : fragments) {
    CHECK(message.find(fragment) != std::string::npos);
  }
}

TEST_CASE("a huge empty length field is an error, not an attention mask of 2^40 rows") {
  // Regression (bug a): input_ids [2^40, 0] with no bytes passed validation
  // and the attention mask [1, 2^40] int64 threw std::bad_alloc.
  std::vector<Sample> s;
  s.push_back(SampleBuilder(7).AddRaw("input_ids", DType::kInt64, {int64_t{1} << 40, 0}, {}).Build());
  CheckResourceError(CollateNoThrow(Ptrs(s), CollateOptions{}),
                     {"'attention_mask'", "1099511627776", "max_batch_tensor_bytes"});
  // The same rows padded without a mask are 0 bytes: fine.
  auto padded = CollateNoThrow(Ptrs(s), Options({}));
  REQUIRE(padded.ok());
  CHECK((*padded)[0].shape == std::vector<int64_t>{1, int64_t{1} << 40, 0});
}

TEST_CASE("row sums that overflow int64 are an error") {
  // Regression (bug b, sums in collation): concatenated rows wrapped around.
  std::vector<Sample> s;
  for (uint64_t id = 1; id <= 2; ++id) {
    s.push_back(SampleBuilder(id).AddRaw("x", DType::kUInt8, {int64_t{1} << 62, 0}, {}).Build());
  }
  CheckResourceError(CollateNoThrow(Ptrs(s), Options({{"x", FieldRule::kConcat}})),
                     {"'x'", "overflow"});
  CollateOptions packed;
  packed.packed = true;
  packed.length_field = "x";
  CheckResourceError(CollateNoThrow(Ptrs(s), packed), {"'x'", "overflow"});
}

TEST_CASE("a row size that overflows is an error") {
  const int64_t big = int64_t{1} << 40;
  std::vector<Sample> s;
  s.push_back(SampleBuilder(1).AddRaw("x", DType::kInt64, {0, big, big}, {}).Build());
  CheckResourceError(CollateNoThrow(Ptrs(s), Options({})), {"'x'", "overflows"});
}

TEST_CASE("a batch tensor over the byte limit is refused before allocating") {
  std::vector<Sample> s = TwoSamples();
  CollateOptions options = Options({});
  options.max_batch_tensor_bytes = 31;  // input_ids and labels are [2, 2] int64 = 32 bytes
  CheckResourceError(CollateNoThrow(Ptrs(s), options), {"32", "31"});
  options.max_batch_tensor_bytes = 32;
  CHECK(CollateNoThrow(Ptrs(s), options).ok());
}

// ASan's operator new aborts on an impossible size instead of throwing
// (allocation-size-too-big): the case only runs in a normal build.
#if !defined(__SANITIZE_ADDRESS__)
TEST_CASE("an allocation failure is an error, not an exception") {
  // 256 x 2^43 bytes of attention mask is more address space than any
  // machine has: operator new throws whatever the overcommit policy.
  std::vector<Sample> one;
  one.push_back(
      SampleBuilder(7).AddRaw("input_ids", DType::kInt64, {int64_t{1} << 40, 0}, {}).Build());
  std::vector<const Sample*> group(256, &one[0]);
  CollateOptions options;
  options.max_batch_tensor_bytes = std::numeric_limits<uint64_t>::max();
  CheckResourceError(CollateNoThrow(group, options), {"256 samples"});
}
#endif  // !__SANITIZE_ADDRESS__

TEST_CASE("CollatePlan writes into caller memory exactly what Collate returns, and nothing around it") {
  for (uint32_t seed = 1; seed <= 200; ++seed) {
    INFO("seed " << seed);
    std::mt19937 rng(seed);
    auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
    const size_t batch = static_cast<size_t>(uniform(1, 5));
    const bool packed = uniform(0, 2) == 0;
    std::vector<Sample> samples;
    for (size_t i = 0; i < batch; ++i) {
      const int64_t len = uniform(0, 7);
      std::vector<int64_t> ids(static_cast<size_t>(len));
      for (auto& v : ids) v = uniform(0, 50000);
      std::vector<float> pixels(6);
      for (auto& v : pixels) v = static_cast<float>(uniform(-100, 100)) / 8;
      std::vector<int32_t> extra(static_cast<size_t>(uniform(0, 3)), static_cast<int32_t>(i));
      std::vector<uint16_t> labels(static_cast<size_t>(len), static_cast<uint16_t>(uniform(0, 65535)));
      samples.push_back(SampleBuilder(7 + i)
                            .Add<int64_t>("input_ids", DType::kInt64, {len}, ids)
                            .Add<uint16_t>("labels", DType::kFloat16, {len}, labels)
                            .Add<float>("pixels", DType::kFloat32, {2, 3}, pixels)
                            .Add<int32_t>("extra", DType::kInt32, {static_cast<int64_t>(extra.size())}, extra)
                            .Build());
    }
    const PadSide side = uniform(0, 1) == 0 ? PadSide::kRight : PadSide::kLeft;
    CollateOptions options = Options({{"input_ids", FieldRule::kPad, 3, side},
                                      {"labels", FieldRule::kPad, -1.5, side},
                                      {"pixels", FieldRule::kStack},
                                      {"extra", FieldRule::kConcat}},
                                     /*attention_mask=*/uniform(0, 1) == 0);
    options.packed = packed;
    auto want = Collate(Ptrs(samples), options);
    REQUIRE(want.ok());
    auto plan = CollatePlan::Make(Ptrs(samples), options);
    REQUIRE(plan.ok());
    REQUIRE(plan->outputs().size() == want->size());
    // Every output at an odd offset of one buffer, with guard bytes between.
    constexpr uint8_t kGuard = 0xA5;
    std::vector<size_t> at;
    size_t cursor = 3;
    for (const BatchTensorLayout& l : plan->outputs()) {
      at.push_back(cursor);
      cursor += l.size_bytes + 5;
    }
    std::vector<uint8_t> memory(cursor, kGuard);
    std::vector<uint8_t*> destinations;
    for (size_t a : at) destinations.push_back(memory.data() + a);
    plan->WriteTo(destinations);
    size_t written = 0;
    for (size_t i = 0; i < want->size(); ++i) {
      const BatchTensorLayout& l = plan->outputs()[i];
      const BatchTensor& t = (*want)[i];
      CHECK(l.name == t.name);
      CHECK(l.dtype == t.dtype);
      CHECK(l.shape == t.shape);
      REQUIRE(l.size_bytes == t.bytes.size());
      CHECK(std::vector<uint8_t>(memory.begin() + static_cast<long>(at[i]),
                                 memory.begin() + static_cast<long>(at[i] + l.size_bytes)) == t.bytes);
      written += l.size_bytes;
    }
    CHECK(static_cast<size_t>(std::count(memory.begin(), memory.end(), kGuard)) >= memory.size() - written);
    for (size_t i = 0; i < at.size(); ++i) {
      const size_t end = at[i] + plan->outputs()[i].size_bytes;
      for (size_t g = end; g < end + 5; ++g) CHECK(memory[g] == kGuard);
    }
    for (size_t g = 0; g < 3; ++g) CHECK(memory[g] == kGuard);
  }
}

TEST_CASE("CollatePlan refuses what Collate refuses, with the same error") {
  std::vector<Sample> samples;
  samples.push_back(SampleBuilder(1).Add<int32_t>("labels", DType::kInt32, {2}, {1, 2}).Build());
  CollateOptions options = Options({{"labels", FieldRule::kPad, 0.5}}, /*attention_mask=*/false);
  auto collated = Collate(Ptrs(samples), options);
  auto plan = CollatePlan::Make(Ptrs(samples), options);
  REQUIRE_FALSE(plan.ok());
  CHECK(plan.status() == collated.status());
  options.max_batch_tensor_bytes = 4;
  options.fields[0].pad_value = 0;
  auto over = CollatePlan::Make(Ptrs(samples), options);
  CHECK(over.status().code() == absl::StatusCode::kResourceExhausted);
}

TEST_CASE("CheckPadValue reports what Collate would") {
  CHECK(CheckPadValue(-100, DType::kInt64, "labels").ok());
  CHECK(CheckPadValue(1, DType::kBool, "m").ok());
  const absl::Status s = CheckPadValue(0.5, DType::kInt32, "labels");
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(s.message()), Catch::Contains("'labels'") && Catch::Contains("0.5"));
  CHECK_FALSE(CheckPadValue(70000, DType::kFloat16, "h").ok());
}

}  // namespace
}  // namespace odb::collate
