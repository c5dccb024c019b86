#include "src/buffer/sample_buffer.h"

#include "src/wire/tensor_codec.h"

#include <algorithm>

namespace odb::buffer {

std::optional<wire::Rejection> SampleBuffer::Add(Sample&& sample, bool seq_noted) {
  Epoch& epoch = epochs_[sample.epoch];
  const uint64_t id = sample.meta.id;
  if (sample.seq) {
    const IdSet::Inserted noted =
        seq_noted ? IdSet::Inserted::kNew : epoch.seqs.InsertBounded(*sample.seq, RunsHaveRoom());
    if (noted == IdSet::Inserted::kNoRoom) return TooManyRuns(sample);
    if (noted == IdSet::Inserted::kRepeat) {
      wire::Rejection r;
      r.set_code(wire::DUPLICATE_ID);
      r.set_sample_id(id);
      r.set_has_sample_id(true);
      r.set_producer_id(sample.producer_id);
      r.set_message("sample " + std::to_string(id) + " from producer '" + sample.producer_id + "' has seq " +
                    std::to_string(*sample.seq) + ", which another sample of epoch " +
                    std::to_string(sample.epoch) + " already had; seq must be unique per rank and epoch");
      return r;
    }
  } else if (const IdSet::Inserted seen = epoch.seen.InsertBounded(id, RunsHaveRoom());
             seen != IdSet::Inserted::kNew) {
    if (seen == IdSet::Inserted::kNoRoom) return TooManyRuns(sample);
    wire::Rejection r;
    r.set_code(wire::DUPLICATE_ID);
    r.set_sample_id(id);
    r.set_has_sample_id(true);
    r.set_producer_id(sample.producer_id);
    r.set_message("sample id " + std::to_string(id) + " from producer '" + sample.producer_id +
                  "' was already received in epoch " + std::to_string(sample.epoch) +
                  "; a sample without seq is known by its id, which must be unique per epoch (send "
                  "seq=position to key it by its position instead)");
    return r;
  }
  ++epoch.arrivals;
  uint64_t key = id;
  if (epoch.samples.count(key)) {
    // Another sample the rank holds has this key (a repeated dataset index
    // at another position): key this one apart, keep its id for the trainer.
    sample.user_id = id;
    const uint64_t salt = sample.seq ? *sample.seq : epoch.arrivals;
    do {
      key = RekeyedId(key, salt);
    } while (epoch.samples.count(key));
    sample.meta.id = key;
  }
  if (sample.seq) epoch.by_seq[*sample.seq] = key;
  bytes_ += ChargedBytes(sample);
  epoch.bytes += ChargedBytes(sample);
  ++count_;
  epoch.order.emplace_back(key, epoch.arrivals);
  epoch.samples.emplace(key, Epoch::Held{std::move(sample), epoch.arrivals});
  return std::nullopt;
}

uint64_t SampleBuffer::RekeyedId(uint64_t candidate, uint64_t salt) {
  // splitmix64 of the pair: spreads the keys of repeats over the whole
  // range, far from the small dense ids that datasets use.
  uint64_t z = candidate ^ (salt * 0x9e3779b97f4a7c15ULL) ^ 0x5851f42d4c957f2dULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

size_t SampleBuffer::SeqRuns(uint32_t epoch) const {
  auto it = epochs_.find(epoch);
  return it == epochs_.end() ? 0 : it->second.seqs.Runs();
}

std::optional<uint64_t> SampleBuffer::UserIdOf(uint32_t epoch, uint64_t key) const {
  auto it = epochs_.find(epoch);
  if (it == epochs_.end()) return std::nullopt;
  auto s = it->second.samples.find(key);
  if (s == it->second.samples.end()) return std::nullopt;
  return s->second.sample.UserId();
}

size_t SampleBuffer::BookkeepingEntries() const {
  size_t n = 0;
  for (const auto& [number, e] : epochs_) {
    n += e.order.size() + e.samples.size() + e.seen.Runs() + e.seqs.Runs() + e.by_seq.size();
  }
  return n;
}

size_t SampleBuffer::SeenRuns(uint32_t epoch) const {
  auto it = epochs_.find(epoch);
  return it == epochs_.end() ? 0 : it->second.seen.Runs();
}

uint64_t SampleBuffer::CountInEpoch(uint32_t epoch) const {
  auto it = epochs_.find(epoch);
  return it == epochs_.end() ? 0 : it->second.samples.size();
}

uint64_t SampleBuffer::ChargedBytes(const Sample& sample) {
  return sample.meta.payload_bytes + wire::kBookkeepingBytesPerTensor * sample.tensors.size();
}

uint64_t SampleBuffer::BytesOutsideEpoch(uint32_t epoch) const {
  uint64_t inside = 0;
  auto it = epochs_.find(epoch);
  if (it != epochs_.end()) inside = it->second.bytes;
  return bytes_ - inside;
}

std::vector<SampleMeta> SampleBuffer::Pending(uint32_t epoch, size_t limit) const {
  std::vector<SampleMeta> out;
  auto it = epochs_.find(epoch);
  if (it == epochs_.end()) return out;
  out.reserve(std::min(limit, it->second.samples.size()));
  for (const auto& [key, arrival] : it->second.order) {
    if (out.size() >= limit) break;
    auto s = it->second.samples.find(key);
    if (s != it->second.samples.end() && s->second.arrival == arrival) out.push_back(s->second.sample.meta);
  }
  return out;
}

IdSet::Inserted SampleBuffer::NoteSeq(uint32_t epoch, uint64_t seq) {
  const bool room = RunsHaveRoom();
  return epochs_[epoch].seqs.InsertBounded(seq, room);
}

bool SampleBuffer::RunsHaveRoom() const {
  size_t runs = 0;
  for (const auto& [number, e] : epochs_) runs += e.seen.Runs() + e.seqs.Runs();
  return runs < max_runs_;
}

wire::Rejection SampleBuffer::TooManyRuns(const Sample& sample) const {
  const uint64_t id = sample.UserId();
  wire::Rejection r;
  r.set_code(wire::TOO_LARGE);
  r.set_sample_id(id);
  r.set_has_sample_id(true);
  r.set_producer_id(sample.producer_id);
  const std::string what = sample.seq ? "seq " + std::to_string(*sample.seq) : "id " + std::to_string(id);
  r.set_message("sample " + std::to_string(id) + " from producer '" + sample.producer_id + "' refused: its " +
                what + " is apart from every " + (sample.seq ? "seq" : "id") + " received in epoch " +
                std::to_string(sample.epoch) + ", and the daemon already keeps " + std::to_string(max_runs_) +
                " such separate runs (the memory that makes delivery exactly once; the limit is the "
                "setting buffer.max_id_runs); send " +
                (sample.seq ? "seqs in order (each rank's positions 0, 1, 2, ...)"
                            : "seq=position with each sample (OdbDataLoader does), or ids in order") +
                ", or raise buffer.max_id_runs (~20 B a run); it was not admitted (the same sample may "
                "be sent again once there is room: gaps filled, or an earlier epoch closed)");
  return r;
}

uint64_t SampleBuffer::Frontier(uint32_t epoch) const {
  auto it = epochs_.find(epoch);
  return it == epochs_.end() ? 0 : it->second.seqs.PrefixEnd();
}

std::vector<SampleMeta> SampleBuffer::PendingInOrder(uint32_t epoch, size_t limit, bool all_arrived) const {
  std::vector<SampleMeta> out;
  auto it = epochs_.find(epoch);
  if (it == epochs_.end()) return out;
  const Epoch& e = it->second;
  const uint64_t frontier = e.seqs.PrefixEnd();
  for (const auto& [seq, key] : e.by_seq) {
    if (out.size() >= limit || (!all_arrived && seq >= frontier)) break;
    out.push_back(e.samples.at(key).sample.meta);
  }
  return out;
}

std::vector<Sample> SampleBuffer::Take(uint32_t epoch, const std::vector<uint64_t>& keys) {
  std::vector<Sample> out;
  out.reserve(keys.size());
  for (uint64_t key : keys) {
    if (std::optional<Sample> s = TakeOne(epoch, key)) out.push_back(std::move(*s));
  }
  return out;
}

std::optional<Sample> SampleBuffer::TakeOne(uint32_t epoch, uint64_t key) {
  auto it = epochs_.find(epoch);
  if (it == epochs_.end()) return std::nullopt;
  Epoch& e = it->second;
  auto s = e.samples.find(key);
  if (s == e.samples.end()) return std::nullopt;
  Sample& sample = s->second.sample;
  bytes_ -= ChargedBytes(sample);
  e.bytes -= ChargedBytes(sample);
  --count_;
  if (sample.seq) e.by_seq.erase(*sample.seq);
  std::optional<Sample> out(std::move(sample));
  e.samples.erase(s);
  // Compact the arrival order once it is mostly stale.
  if (e.order.size() > 2 * e.samples.size() + 64) {
    std::erase_if(e.order, [&](const std::pair<uint64_t, uint64_t>& entry) {
      auto held = e.samples.find(entry.first);
      return held == e.samples.end() || held->second.arrival != entry.second;
    });
  }
  return out;
}

std::vector<Sample> SampleBuffer::CloseEpoch(uint32_t epoch) {
  std::vector<Sample> rest;
  auto it = epochs_.find(epoch);
  if (it == epochs_.end()) return rest;
  for (const auto& [key, arrival] : it->second.order) {
    auto s = it->second.samples.find(key);
    if (s == it->second.samples.end() || s->second.arrival != arrival) continue;
    bytes_ -= ChargedBytes(s->second.sample);
    --count_;
    rest.push_back(std::move(s->second.sample));
    it->second.samples.erase(s);
  }
  epochs_.erase(it);
  return rest;
}

}  // namespace odb::buffer
