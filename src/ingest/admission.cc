#include "src/ingest/admission.h"

#include <algorithm>

#include "src/ingest/decoder.h"

namespace odb::ingest {

std::optional<std::string> AdmissionPolicy::EpochRefusal(uint32_t epoch, const EpochView& view) {
  const std::string e = "epoch " + std::to_string(epoch);
  // A closed epoch is the tracker's to judge (already ended, or late for a
  // Non-Join closure).
  if (view.closed) return std::nullopt;
  if (view.trainer) {
    // The trainer decides where the job is, also on a fresh daemon after a
    // resume: its epoch, not epoch 0, is where the held epochs start.
    const uint32_t trainer = *view.trainer;
    if (epoch < trainer) {
      return e + " is before epoch " + std::to_string(trainer) +
             ", the one the trainer trains now; it will not be trained: send the trainer's epoch";
    }
    if (epoch - trainer > kEpochHorizon) {
      return e + " is more than " + std::to_string(kEpochHorizon) + " epochs after epoch " +
             std::to_string(trainer) + ", the one the trainer trains now; send epochs in order";
    }
    return std::nullopt;
  }
  if (epoch < view.first_open) {
    return e + " is before epoch " + std::to_string(view.first_open) +
           ", the first one this daemon has not closed; it will not be trained";
  }
  // Before the trainer asks (the producers of a resumed job may start first,
  // at any epoch): at most kEpochHorizon + 1 neighbouring epochs are held.
  if (const auto& range = view.open_range) {
    const uint32_t lo = std::min(range->first, epoch), hi = std::max(range->second, epoch);
    if (hi - lo > kEpochHorizon) {
      return e + " is more than " + std::to_string(kEpochHorizon) + " epochs away from epoch " +
             std::to_string(epoch == lo ? range->second : range->first) +
             ", which producers already send (the trainer has not asked for an epoch yet); send epochs in "
             "order";
    }
  }
  return std::nullopt;
}

Verdict AdmissionPolicy::AtDoor(const Sample& sample, const std::string& connection_producer,
                                const EpochView& view) const {
  const uint64_t id = sample.meta.id;
  Verdict v;
  if (sample.producer_id != connection_producer) {
    v.kind = Verdict::Kind::kRejectUncounted;
    v.rejection = MakeReject(wire::UNKNOWN_PRODUCER,
                             "sample " + std::to_string(id) + " names producer '" + sample.producer_id +
                                 "' but its connection said hello as '" + connection_producer +
                                 "'; send hello first and keep one producer id per connection",
                             sample.producer_id, &id)
                      .rejection;
    return v;
  }
  if (std::optional<std::string> why = EpochRefusal(sample.epoch, view)) {
    // Filed under the trainer's epoch when there is one: its summary says
    // why its samples did not come.
    v.kind = Verdict::Kind::kRefuse;
    v.filed_epoch = view.trainer ? *view.trainer : view.open_range ? view.open_range->first : view.first_open;
    v.rejection = MakeReject(wire::WRONG_EPOCH,
                             "sample " + std::to_string(id) + " from producer '" + sample.producer_id +
                                 "' refused: " + *why,
                             sample.producer_id, &id)
                      .rejection;
    return v;
  }
  if (sample.user_id) {
    // daemon_key is the payload exchange's: a producer that sets it would
    // choose how the daemon keys its samples.
    v.kind = Verdict::Kind::kRejectCounted;
    v.rejection = MakeReject(wire::MALFORMED_HEADER,
                             "sample " + std::to_string(*sample.user_id) + " from producer '" +
                                 sample.producer_id +
                                 "' sets daemon_key, a field only daemons send each other; leave it unset",
                             sample.producer_id, &*sample.user_id)
                      .rejection;
    return v;
  }
  if (options_.deterministic && !view.closed && !sample.seq) {
    v.kind = Verdict::Kind::kRejectCounted;
    v.rejection = MakeReject(wire::MALFORMED_HEADER,
                             "sample " + std::to_string(id) + " from producer '" + sample.producer_id +
                                 "' has no seq; alignment.deterministic needs every sample's position in "
                                 "its rank's list (Producer.send(..., seq=i); OdbDataLoader sends it)",
                             sample.producer_id, &id)
                      .rejection;
  }
  return v;
}

wire::Rejection AdmissionPolicy::DuplicateSeq(const Sample& sample) const {
  const uint64_t id = sample.meta.id;
  return MakeReject(wire::DUPLICATE_ID,
                    "sample " + std::to_string(id) + " from producer '" + sample.producer_id + "' has seq " +
                        std::to_string(sample.seq.value_or(0)) + ", which another sample of epoch " +
                        std::to_string(sample.epoch) + " already had; seq must be unique per rank and epoch",
                    sample.producer_id, &id)
      .rejection;
}

wire::Rejection AdmissionPolicy::SeqBeyondLimit(const Sample& sample, uint64_t limit, uint64_t frontier) const {
  const uint64_t id = sample.meta.id;
  return MakeReject(wire::CREDIT_EXCEEDED,
                    "sample " + std::to_string(id) + " from producer '" + sample.producer_id + "' has seq " +
                        std::to_string(sample.seq.value_or(0)) + ", past the seq limit " + std::to_string(limit) +
                        " of epoch " + std::to_string(sample.epoch) + " (its first " + std::to_string(frontier) +
                        " positions arrived, and alignment.deterministic admits at most one window ahead of "
                        "them); wait for the daemon's credit (ProducerCredit.seq_limit; the odb clients do)",
                    sample.producer_id, &id)
      .rejection;
}

std::optional<wire::Rejection> AdmissionPolicy::OverBudget(const Sample& sample) const {
  if (!options_.reject_over_budget || grouping::FitsAlone(options_.budget, sample.meta.lengths))
    return std::nullopt;
  const uint64_t id = sample.meta.id;
  return MakeReject(wire::OVER_BUDGET,
                    "sample " + std::to_string(id) +
                        " (tokens=" + std::to_string(sample.meta.lengths.tokens) +
                        ", vision=" + std::to_string(sample.meta.lengths.vision_patches) +
                        ", audio=" + std::to_string(sample.meta.lengths.audio_frames) + ") fits no budget (" +
                        grouping::DescribeBudget(options_.budget) +
                        "); raise the budget or set grouping.over_budget: isolate",
                    sample.producer_id, &id)
      .rejection;
}

wire::Rejection AdmissionPolicy::RefuseEndStream(const std::string& producer_id, const std::string& why,
                                                 uint64_t refused, uint64_t samples_sent) {
  // Not a count mismatch: the stream's epoch is not one the daemon holds, and
  // that is what the producer is told.
  return MakeReject(
             wire::WRONG_EPOCH,
             "end_stream of producer '" + producer_id + "' refused: " + why +
                 (refused > 0 ? " (" + std::to_string(refused) + " of its " + std::to_string(samples_sent) +
                                    " samples of that epoch were refused for this reason)"
                              : std::string()),
             producer_id)
      .rejection;
}

}  // namespace odb::ingest
