#ifndef ODB_COMMON_SAMPLE_H_
#define ODB_COMMON_SAMPLE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "src/common/dtype.h"

namespace odb {

// The lengths that budgets and cost models see: LLM tokens after all
// preprocessing, plus optional per-modality sizes (0 when absent).
struct SampleLengths {
  uint32_t tokens = 0;
  uint32_t vision_patches = 0;
  uint32_t audio_frames = 0;
};

// A few bytes per sample: what grouping, alignment and balancing need.
// This is what peers exchange every round; payloads stay where they are.
// SampleMeta::loss_tokens when the producer did not count them: every token bears loss.
inline constexpr uint32_t kEveryTokenBearsLoss = 0xffffffffu;

struct SampleMeta {
  uint64_t id = 0;
  int32_t owner_rank = 0;  // rank whose daemon holds the payload
  SampleLengths lengths;
  uint64_t payload_bytes = 0;
  // Loss-bearing tokens (labels not equal to the ignore index: prompt-masked
  // SFT counts only the answer), <= lengths.tokens; loss weights and
  // accumulation windows count these (align::LossTokensOf).
  uint32_t loss_tokens = kEveryTokenBearsLoss;
};

// A read-only view of one tensor of a sample. `data` points into a frame that
// the owning Sample keeps alive (a zmq::message_t, never copied before collation).
struct TensorView {
  std::string name;
  DType dtype = DType::kUnspecified;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;
  size_t size_bytes = 0;

  int64_t NumElements() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

// Owner of a received frame's bytes. Implemented by the ingest adapter over
// zmq::message_t, and by plain vectors in tests.
class FrameHolder {
 public:
  virtual ~FrameHolder() = default;
};

// One buffered sample: its metadata, tensor views and the frames behind them.
struct Sample {
  SampleMeta meta;
  uint32_t epoch = 0;
  std::string producer_id;
  // Position in its rank's list for the epoch, when the producer sent one
  // (alignment.deterministic plans in this order).
  std::optional<uint64_t> seq;
  // The producer's id when the daemon keyed the sample otherwise. Inside the
  // daemon (planner, payload exchange, step builder) a sample is known by
  // (owner rank, meta.id), which must be unique among the samples of its
  // epoch that the rank holds; the producer's id need not be (a sampler with
  // replacement repeats a dataset index at two positions of the list). The
  // buffer keys such a repeat with another number and keeps the producer's id
  // here; what the trainer sees (the step header) is UserId().
  std::optional<uint64_t> user_id;
  std::vector<TensorView> tensors;
  std::vector<std::shared_ptr<FrameHolder>> frames;  // keep `tensors[i].data` valid

  uint64_t UserId() const { return user_id.value_or(meta.id); }

  const TensorView* FindTensor(const std::string& name) const {
    for (const auto& t : tensors) {
      if (t.name == name) return &t;
    }
    return nullptr;
  }
};

}  // namespace odb

#endif  // ODB_COMMON_SAMPLE_H_
