#include "src/buffer/sample_buffer.h"

#include "src/wire/tensor_codec.h"

#include <algorithm>

namespace odb::buffer {

std::optional<wire::Rejection> SampleBuffer::Add(Sample&& sample) {
  Epoch& epoch = epochs_[sample.epoch];
  const uint64_t id = sample.meta.id;
  if (!epoch.seen.Insert(id)) {
    wire::Rejection r;
    r.set_code(wire::DUPLICATE_ID);
    r.set_sample_id(id);
    r.set_has_sample_id(true);
    r.set_producer_id(sample.producer_id);
    r.set_message("sample id " + std::to_string(id) + " from producer '" + sample.producer_id +
                  "' was already received in epoch " + std::to_string(sample.epoch) +
                  "; ids must be unique per epoch");
    return r;
  }
  if (sample.seq) {
    NoteSeq(sample.epoch, *sample.seq);  // the caller checked it is new
    epoch.by_seq[*sample.seq] = id;
  }
  bytes_ += ChargedBytes(sample);
  epoch.bytes += ChargedBytes(sample);
  ++count_;
  epoch.order.push_back(id);
  epoch.samples.emplace(id, std::move(sample));
  return std::nullopt;
}

size_t SampleBuffer::BookkeepingEntries() const {
  size_t n = 0;
  for (const auto& [number, e] : epochs_) {
    n += e.order.size() + e.samples.size() + e.seen.Runs() + e.by_seq.size() + e.seq_ahead.size();
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
  for (uint64_t id : it->second.order) {
    if (out.size() >= limit) break;
    auto s = it->second.samples.find(id);
    if (s != it->second.samples.end()) out.push_back(s->second.meta);
  }
  return out;
}

bool SampleBuffer::NoteSeq(uint32_t epoch, uint64_t seq) {
  Epoch& e = epochs_[epoch];
  if (seq < e.frontier || !e.seq_ahead.insert(seq).second) return false;
  while (!e.seq_ahead.empty() && *e.seq_ahead.begin() == e.frontier) {
    e.seq_ahead.erase(e.seq_ahead.begin());
    ++e.frontier;
  }
  return true;
}

uint64_t SampleBuffer::Frontier(uint32_t epoch) const {
  auto it = epochs_.find(epoch);
  return it == epochs_.end() ? 0 : it->second.frontier;
}

std::vector<SampleMeta> SampleBuffer::PendingInOrder(uint32_t epoch, size_t limit, bool all_arrived) const {
  std::vector<SampleMeta> out;
  auto it = epochs_.find(epoch);
  if (it == epochs_.end()) return out;
  const Epoch& e = it->second;
  for (const auto& [seq, id] : e.by_seq) {
    if (out.size() >= limit || (!all_arrived && seq >= e.frontier)) break;
    out.push_back(e.samples.at(id).meta);
  }
  return out;
}

std::vector<Sample> SampleBuffer::Take(uint32_t epoch, const std::vector<uint64_t>& ids) {
  std::vector<Sample> out;
  out.reserve(ids.size());
  for (uint64_t id : ids) {
    if (std::optional<Sample> s = TakeOne(epoch, id)) out.push_back(std::move(*s));
  }
  return out;
}

std::optional<Sample> SampleBuffer::TakeOne(uint32_t epoch, uint64_t id) {
  auto it = epochs_.find(epoch);
  if (it == epochs_.end()) return std::nullopt;
  Epoch& e = it->second;
  auto s = e.samples.find(id);
  if (s == e.samples.end()) return std::nullopt;
  bytes_ -= ChargedBytes(s->second);
  e.bytes -= ChargedBytes(s->second);
  --count_;
  if (s->second.seq) e.by_seq.erase(*s->second.seq);
  std::optional<Sample> out(std::move(s->second));
  e.samples.erase(s);
  // Compact the arrival order once it is mostly stale.
  if (e.order.size() > 2 * e.samples.size() + 64) {
    std::erase_if(e.order, [&](uint64_t x) { return !e.samples.count(x); });
  }
  return out;
}

std::vector<Sample> SampleBuffer::CloseEpoch(uint32_t epoch) {
  std::vector<Sample> rest;
  auto it = epochs_.find(epoch);
  if (it == epochs_.end()) return rest;
  for (uint64_t id : it->second.order) {
    auto s = it->second.samples.find(id);
    if (s == it->second.samples.end()) continue;
    bytes_ -= ChargedBytes(s->second);
    --count_;
    rest.push_back(std::move(s->second));
    it->second.samples.erase(s);
  }
  epochs_.erase(it);
  return rest;
}

}  // namespace odb::buffer
