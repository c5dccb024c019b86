#include "src/ingest/producer_liveness.h"

namespace odb::ingest {

ProducerLiveness::ProducerLiveness(const Clock& clock, uint32_t producer_timeout_ms)
    : clock_(clock), timeout_ms_(producer_timeout_ms), last_heard_(clock.Now()) {}

void ProducerLiveness::NoteHeard() { last_heard_ = clock_.Now(); }

bool ProducerLiveness::Silent() const {
  return timeout_ms_ != 0 && clock_.Now() - last_heard_ > std::chrono::milliseconds(timeout_ms_);
}

bool ProducerLiveness::Stalled(bool stalled) {
  if (!stalled) {
    stall_since_.reset();
    return false;
  }
  const auto now = clock_.Now();
  if (!stall_since_) stall_since_ = now;
  return now - *stall_since_ >= kStallGrace;
}

bool ProducerLiveness::ProbeDue() {
  const auto now = clock_.Now();
  if (now - last_probe_ <= kProbeEvery) return false;
  last_probe_ = now;
  return true;
}

bool ProducerLiveness::Quiet(Clock::TimePoint last_heard) const {
  return clock_.Now() - last_heard > kProbeEvery;
}

std::string DescribeSilence(const SilenceReport& r) {
  std::string open;
  for (const auto& p : r.open) open += (open.empty() ? "" : ", ") + p;
  const size_t silent = r.expected > r.ended + r.open.size() ? r.expected - r.ended - r.open.size() : 0;
  const std::string rejected =
      r.rejected == 0
          ? std::string()
          : "; " + std::to_string(r.rejected) +
                " input(s) were rejected during this epoch (the rejections and the daemon's log say why)";
  return "no message from any producer for " + std::to_string(r.timeout_ms) + " ms while epoch " +
         std::to_string(r.epoch) + "'s input is incomplete: " + std::to_string(r.ended) + " of " +
         std::to_string(r.expected) + " expected producer(s) ended their stream; " +
         (open.empty() ? std::string("no stream is open")
                       : "open streams (samples sent, no end_stream): " + open) +
         "; " + std::to_string(silent) + " expected producer(s) sent nothing of epoch " +
         std::to_string(r.epoch) + " yet" + rejected +
         ". A data worker probably died or hangs (emit.producer_timeout_ms)";
}

std::string DescribeStall(const StallReport& r) {
  return "alignment.deterministic: rank " + std::to_string(r.rank) + " waits for epoch " +
         std::to_string(r.epoch) + "'s sample seq " + std::to_string(r.frontier) + " (it has " +
         std::to_string(r.in_order) + " samples in order and needs " + std::to_string(r.window + 1) +
         ") but no producer can send it: the buffer holds " + std::to_string(r.buffered_samples) +
         " samples / " + std::to_string(r.buffered_bytes) + " bytes of its limits (buffer.max_samples " +
         std::to_string(r.max_samples) + ", buffer.max_bytes " + std::to_string(r.max_bytes) +
         "). Raise buffer.max_bytes or lower grouping.window (a rank buffers up to two windows of samples "
         "in order), or check that the producer of that seq is alive";
}

}  // namespace odb::ingest
