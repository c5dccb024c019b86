#include "src/emit/step_builder.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <map>
#include <utility>

#include "src/collate/collator.h"
#include "src/emit/step_encoder.h"

namespace odb::emit {
namespace {

// Batch tensors of at least this size are recycled; at most this many idle
// buffers and bytes are kept (idle memory next to buffer.max_bytes).
constexpr size_t kPooledBufferMinBytes = 64 << 10;
constexpr size_t kPooledBuffersMax = 8;
constexpr uint64_t kPooledBytesMax = uint64_t{256} << 20;

// The sample with only (keep = true) or without (keep = false) the named
// tensors; frames are shared, not copied.
Sample WithFields(const Sample& sample, const std::vector<std::string>& names, bool keep) {
  Sample out = sample;
  std::erase_if(out.tensors, [&](const TensorView& t) {
    return (std::find(names.begin(), names.end(), t.name) != names.end()) != keep;
  });
  return out;
}

// The prefix of an encoder phase's batch tensors ("<prefix><field>").
const char* PhaseBatchPrefix(EncoderPhase phase) {
  switch (phase) {
    case EncoderPhase::kVision:
      return "enc.";
    case EncoderPhase::kAudio:
      return "audio.";
  }
  std::abort();
}

}  // namespace

const std::vector<std::string>& StepBuilder::PhaseFields(EncoderPhase phase) const {
  switch (phase) {
    case EncoderPhase::kVision:
      return options_.encoder_fields;
    case EncoderPhase::kAudio:
      return options_.audio_fields;
  }
  std::abort();
}

StepBuilder::StepBuilder(StepBuilderOptions options, DaemonState& state, DaemonMetrics& metrics,
                         exchange::PayloadExchange* exchange)
    : options_(std::move(options)),
      state_(state),
      metrics_(metrics),
      exchange_(exchange),
      batch_buffers_(
          std::make_shared<BufferPool>(kPooledBufferMinBytes, kPooledBuffersMax, kPooledBytesMax)) {}

absl::StatusOr<StepBuilder::StepSamples> StepBuilder::Gather(uint32_t epoch, const StepPlan& plan,
                                                             const std::function<bool()>& cancelled) {
  using SampleKey = exchange::SampleKey;
  // Keys in plan order: the LLM batch first, then each encoder phase's
  // samples not already in it (a sample both emitted and encoded here is taken once).
  size_t encoded = 0;
  for (const PhaseRoute& route : plan.phases) encoded += route.ids.size();
  std::vector<SampleKey> keys;
  keys.reserve(plan.sample_ids.size() + encoded);
  for (size_t i = 0; i < plan.sample_ids.size(); ++i)
    keys.push_back(SampleKey{plan.sample_owners[i], plan.sample_ids[i]});
  std::vector<size_t> llm_index(keys.size());
  std::array<std::vector<size_t>, kEncoderPhases> phase_index;
  for (size_t p = 0; p < kEncoderPhases; ++p) phase_index[p].resize(plan.phases[p].ids.size());
  for (size_t i = 0; i < keys.size(); ++i) llm_index[i] = i;
  const bool all_own = std::all_of(plan.sample_owners.begin(), plan.sample_owners.end(),
                                   [&](int32_t owner) { return owner == options_.rank; });
  if (!all_own || encoded > 0) {
    std::map<SampleKey, size_t> index;
    std::vector<SampleKey> unique;
    unique.reserve(keys.size() + encoded);
    auto add = [&](const SampleKey& key) {
      auto [it, inserted] = index.emplace(key, unique.size());
      if (inserted) unique.push_back(key);
      return it->second;
    };
    for (size_t i = 0; i < keys.size(); ++i) llm_index[i] = add(keys[i]);
    for (size_t p = 0; p < kEncoderPhases; ++p) {
      const PhaseRoute& route = plan.phases[p];
      for (size_t i = 0; i < route.ids.size(); ++i) phase_index[p][i] = add({route.owners[i], route.ids[i]});
    }
    keys = std::move(unique);
  }
  StepSamples out;
  out.owned.resize(keys.size());
  std::vector<size_t> elsewhere;
  {
    MutexLock lock(state_.mu);
    for (size_t k = 0; k < keys.size(); ++k) {
      std::optional<Sample> own;
      if (keys[k].owner_rank == options_.rank) own = state_.buffer.TakeOne(epoch, keys[k].id);
      if (own) {
        out.owned[k] = std::move(*own);
      } else {
        elsewhere.push_back(k);
      }
    }
  }
  // A peer's payload (or our own, parked by the exchange). Payloads move
  // while earlier steps are emitted; wait only for these, up to the
  // exchange's collective timeout on its (the daemon's injected) clock.
  const Clock::TimePoint deadline = exchange_ != nullptr ? exchange_->PayloadDeadline() : Clock::TimePoint{};
  for (size_t k : elsewhere) {
    if (exchange_ == nullptr) {
      return absl::InternalError("planner returned sample " + std::to_string(keys[k].id) +
                                 " that is not buffered on rank " + std::to_string(options_.rank));
    }
    auto sample = exchange_->Take(keys[k], deadline, cancelled);
    if (!sample.ok()) return sample.status();
    out.owned[k] = std::move(*sample);
  }
  out.llm.reserve(llm_index.size());
  for (size_t i : llm_index) out.llm.push_back(&out.owned[i]);
  for (size_t p = 0; p < kEncoderPhases; ++p) {
    out.phases[p].reserve(phase_index[p].size());
    for (size_t i : phase_index[p]) out.phases[p].push_back(&out.owned[i]);
  }
  return out;
}

absl::StatusOr<std::optional<ArenaPlacement>> StepBuilder::ReserveInArena(
    StepArena& arena, const std::vector<uint64_t>& sizes, const std::function<bool()>& cancelled) {
  auto placed =
      AllocateStepBlock(arena, sizes, std::chrono::milliseconds(options_.step_arena_wait_ms), cancelled);
  if (placed.ok()) {
    metrics_.step_arena_steps.fetch_add(1);
    return std::optional<ArenaPlacement>(std::move(*placed));
  }
  const absl::StatusCode code = placed.status().code();
  if (code == absl::StatusCode::kDeadlineExceeded) {
    // Back-pressure that did not clear: the trainer keeps every block. Stop with the cause.
    return absl::ResourceExhaustedError(placed.status().message());  // Daemon::Fail names the rank
  }
  if (code == absl::StatusCode::kCancelled) return placed.status();
  // A step larger than the arena, or a trainer that died holding the arena:
  // this step goes as frames (nothing is lost), and the reason is logged.
  metrics_.step_arena_frame_fallbacks.fetch_add(1);
  if (!arena_fallback_logged_) {
    arena_fallback_logged_ = true;
    spdlog::warn("a step goes to the trainer as frames instead of the step arena: {} (logged once)",
                 std::string(placed.status().message()));
  }
  return std::optional<ArenaPlacement>();
}

absl::StatusOr<StepBuilder::BuiltStep> StepBuilder::Build(uint32_t epoch, const StepPlan& plan,
                                                          const std::function<bool()>& cancelled,
                                                          StepArena* arena) {
  auto gathered = Gather(epoch, plan, cancelled);
  if (!gathered.ok()) return gathered.status();
  StepSamples& samples = *gathered;
  wire::Step step;
  step.set_epoch(epoch);
#define ODB_SET_STEP_FIELD(type, name, dflt, doc) step.set_##name(plan.name);
  ODB_STEP_FIELDS(ODB_SET_STEP_FIELD)
#undef ODB_SET_STEP_FIELD
#define ODB_SET_STEP_JOB_FIELD(type, name, dflt, doc) step.set_##name(options_.name);
  ODB_STEP_JOB_FIELDS(ODB_SET_STEP_JOB_FIELD)
#undef ODB_SET_STEP_JOB_FIELD
  const bool phases = options_.phase_plans;
  // With per-phase plans the encoder fields travel in their encoder batch only
  // (filtered views; frames are shared). Without, the samples are used as they are.
  std::vector<std::string> encoder_only;
  for (size_t p = 0; p < kEncoderPhases; ++p) {
    const std::vector<std::string>& fields = PhaseFields(static_cast<EncoderPhase>(p));
    encoder_only.insert(encoder_only.end(), fields.begin(), fields.end());
  }
  std::vector<Sample> filtered;
  std::array<std::vector<Sample>, kEncoderPhases> phase_samples;
  std::vector<const Sample*> llm_group;
  filtered.reserve(phases ? plan.sample_ids.size() : 0);
  for (size_t i = 0; i < plan.sample_ids.size(); ++i) {
    const Sample& s = *samples.llm[i];
    if (phases) {
      filtered.push_back(WithFields(s, encoder_only, false));
      llm_group.push_back(&filtered.back());
    } else {
      llm_group.push_back(&s);
    }
#define ODB_ADD_SAMPLE_FIELD(type, name, value, always, doc) step.add_##name(value);
#define ODB_ADD_OPTIONAL_SAMPLE_FIELD(type, name, present, value, doc) \
  step.add_##name((value).value_or(0));                                \
  step.add_##present((value).has_value());
    ODB_STEP_SAMPLE_FIELDS(ODB_ADD_SAMPLE_FIELD, ODB_ADD_OPTIONAL_SAMPLE_FIELD)
#undef ODB_ADD_OPTIONAL_SAMPLE_FIELD
#undef ODB_ADD_SAMPLE_FIELD
  }
  for (size_t p = 0; p < kEncoderPhases; ++p) {
    const EncoderPhase phase = static_cast<EncoderPhase>(p);
    const PhaseRoute& route = plan.phases[p];
    const std::vector<const Sample*>& encoded = samples.phases[p];
    for (size_t i = 0; i < route.ids.size(); ++i) {
      phase_samples[p].push_back(WithFields(*encoded[i], PhaseFields(phase), true));
    }
    const bool vision = phase == EncoderPhase::kVision;
#define ODB_ADD_ROUTE_FIELD(type, vision_name, audio_name, llm_order, value, doc)         \
  for (size_t i = 0; i < ((llm_order) ? route.src_rank.size() : route.ids.size()); ++i) { \
    (vision ? step.mutable_##vision_name() : step.mutable_##audio_name())->Add(value);    \
  }
    ODB_STEP_ROUTE_FIELDS(ODB_ADD_ROUTE_FIELD)
#undef ODB_ADD_ROUTE_FIELD
  }
  // Plan both batches first (every check), so that the step's size is known
  // before its memory is chosen; then write each batch tensor once, into the
  // step arena's block or into pooled buffers that become frames.
  std::vector<collate::CollatePlan> plans;
  std::vector<collate::BatchTensorLayout> layouts;
  auto plan_group = [&](const std::vector<const Sample*>& group, const std::string& prefix,
                        const collate::CollateOptions& options) -> absl::Status {
    if (group.empty()) return absl::OkStatus();
    auto collate_plan = collate::CollatePlan::Make(group, options);
    if (!collate_plan.ok()) return collate_plan.status();
    for (collate::BatchTensorLayout layout : collate_plan->outputs()) {
      layout.name = prefix + layout.name;
      layouts.push_back(std::move(layout));
    }
    plans.push_back(std::move(*collate_plan));
    return absl::OkStatus();
  };
  absl::Status collated = plan_group(llm_group, "", options_.collate);
  // The encoder batches have no tokens: no attention mask, never packed.
  collate::CollateOptions enc_options = options_.collate;
  enc_options.attention_mask = false;
  enc_options.packed = false;
  for (size_t p = 0; p < kEncoderPhases && collated.ok(); ++p) {
    if (phase_samples[p].empty()) continue;
    std::vector<const Sample*> group;
    for (const Sample& s : phase_samples[p]) group.push_back(&s);
    collated = plan_group(group, PhaseBatchPrefix(static_cast<EncoderPhase>(p)), enc_options);
  }
  std::optional<ArenaPlacement> placed;
  std::vector<collate::BatchTensor> tensors;
  if (collated.ok() && arena != nullptr && !layouts.empty()) {
    std::vector<uint64_t> sizes;
    for (const auto& layout : layouts) sizes.push_back(layout.size_bytes);
    auto reserved = ReserveInArena(*arena, sizes, cancelled);
    if (!reserved.ok()) return reserved.status();
    placed = std::move(*reserved);
  }
  if (collated.ok() && placed) {
    size_t next = 0;
    for (const collate::CollatePlan& p : plans) {
      std::vector<uint8_t*> destinations;
      for (size_t i = 0; i < p.outputs().size(); ++i) {
        destinations.push_back(reinterpret_cast<uint8_t*>(arena->At(placed->tensor_offsets[next++])));
      }
      p.WriteTo(destinations);
    }
  } else if (collated.ok()) {
    for (const collate::CollatePlan& p : plans) {
      auto written = p.WriteToBuffers(batch_buffers_.get());
      if (!written.ok()) {
        collated = written.status();
        break;
      }
      for (auto& t : *written) tensors.push_back(std::move(t));
    }
    for (size_t i = 0; i < tensors.size(); ++i) tensors[i].name = layouts[i].name;
  }
  if (!collated.ok() && phases) {
    // Other ranks' routes count on this rank's encoder outputs: a step that
    // cannot be batched breaks the plan for everyone.
    return absl::InternalError(
        "step " + std::to_string(plan.step_index) +
        " cannot be collated under per-phase plans: " + std::string(collated.message()));
  }
  if (!collated.ok()) {
    // Admission checks every sample against the epoch's schema, so only a
    // resource limit gets here. The step cannot be replaced by an IDLE one:
    // the other ranks' loss weights already count this rank's tokens, and
    // Σ_r w_r would fall below W. The job stops with the reason instead.
    std::string ids;
    for (const Sample* s : llm_group) ids += (ids.empty() ? "" : ", ") + std::to_string(s->UserId());
    return absl::AbortedError("step " + std::to_string(plan.step_index) + " of epoch " +
                              std::to_string(epoch) + " cannot be collated (" +
                              std::string(collated.message()) + "; samples " + ids +
                              "); its loss weights would no longer sum to W, so the job stops");
  }
  MutexLock lock(state_.mu);
  for (auto& r : state_.rejections.TakeUnreported()) *step.add_rejections() = std::move(r);
  wire::EpochSummary& totals = state_.epoch_totals[epoch];
  totals.set_steps(totals.steps() + 1);
  if (step.idle()) totals.set_idle_steps(totals.idle_steps() + 1);
  totals.set_emitted(totals.emitted() + step.sample_ids_size());
  totals.set_real_tokens(totals.real_tokens() + step.real_tokens());
  totals.set_padded_tokens(totals.padded_tokens() + step.padded_tokens());
  metrics_.steps_emitted.fetch_add(1);
  if (step.idle()) metrics_.idle_steps.fetch_add(1);
  metrics_.samples_emitted.fetch_add(step.sample_ids_size());
  metrics_.real_tokens.fetch_add(step.real_tokens());
  metrics_.padded_tokens.fetch_add(step.padded_tokens());
  if (placed) return BuiltStep{EncodeArenaStep(std::move(step), layouts, *placed), true};
  return BuiltStep{EncodeStep(std::move(step), std::move(tensors), batch_buffers_), false};
}

std::vector<zmq::message_t> StepBuilder::FinishEpoch(uint32_t epoch, const RoundOutcome& outcome) {
  MutexLock lock(state_.mu);
  wire::EpochSummary summary = state_.epoch_totals[epoch];
  summary.set_epoch(epoch);
  summary.set_received(state_.epoch_received[epoch]);
  summary.set_rejections_are_errors(options_.rejections_are_errors);
  RejectionLog::EpochRecord rejections = state_.rejections.TakeEpoch(epoch);
  for (auto& r : rejections.kept) *summary.add_rejections() = std::move(r);
  summary.set_rejected(rejections.count);
  // Deduplicated by key (the plan's and the buffer's lists overlap), then
  // reported by the producer's id: a repeated id not emitted at two
  // positions is listed twice.
  std::map<uint64_t, uint64_t> not_emitted;  // key -> producer's id
  for (uint64_t key : outcome.not_emitted) not_emitted.emplace(key, state_.buffer.UserIdOf(epoch, key).value_or(key));
  for (Sample& s : state_.buffer.CloseEpoch(epoch)) not_emitted.emplace(s.meta.id, s.UserId());
  std::vector<uint64_t> ids;
  for (const auto& [key, id] : not_emitted) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  for (uint64_t id : ids) summary.add_not_emitted_ids(id);
  state_.tracker.CloseEpoch(epoch, options_.non_join);
  state_.epoch_received.erase(epoch);
  state_.epoch_totals.erase(epoch);
  spdlog::info(
      "rank {} epoch {} done: received={} emitted={} rejected={} not_emitted={} steps={} idle={} "
      "padding={:.1f}%",
      options_.rank, epoch, summary.received(), summary.emitted(), summary.rejected(),
      summary.not_emitted_ids_size(), summary.steps(), summary.idle_steps(),
      summary.padded_tokens()
          ? 100.0 * (1.0 - double(summary.real_tokens()) / double(summary.padded_tokens()))
          : 0.0);
  wire::DaemonMessage message;
  message.set_version(wire::PROTOCOL_VERSION_CURRENT);
  *message.mutable_epoch_end() = std::move(summary);
  state_.current_epoch.reset();
  state_.cv.NotifyAll();
  return EncodeControl(message);
}

}  // namespace odb::emit
