#include "src/ingest/credit_ledger.h"

#include <algorithm>

namespace odb::ingest {
namespace {

// Payload bytes lent per sample of credit at least (or the producer's largest
// sample so far), up to its byte window.
constexpr uint64_t kBytesPerLentSample = 64 << 10;
// A producer that may send and sends nothing this long counts as idle.
constexpr auto kIdleAfter = std::chrono::seconds(1);

}  // namespace

CreditLedger::CreditLedger(uint64_t buffer_max_bytes, uint64_t buffer_max_samples)
    : buffer_max_bytes_(buffer_max_bytes),
      buffer_max_samples_(buffer_max_samples),
      // A sample may take at most half the buffer: once the buffer drains it
      // always fits, and ahead-of-epoch producers (half the buffer) never block it.
      max_sample_bytes_(std::max<uint64_t>(1, buffer_max_bytes / 2)),
      window_samples_(std::clamp<uint64_t>(buffer_max_samples / 4, 1, 1024)) {}

bool CreditLedger::Charge(CreditAccount& account, uint64_t bytes, Clock::TimePoint now) {
  if (account.samples <= 0 || account.bytes < static_cast<int64_t>(bytes)) return false;
  account.samples -= 1;
  account.bytes -= static_cast<int64_t>(bytes);
  account.window.OnSampleUsed();
  account.last_sample = now;
  account.largest_sample = std::max(account.largest_sample, bytes);
  outstanding_samples_ -= 1;
  outstanding_bytes_ -= static_cast<int64_t>(bytes);
  return true;
}

void CreditLedger::Release(CreditAccount& account) {
  outstanding_bytes_ -= std::max<int64_t>(account.bytes, 0);
  outstanding_samples_ -= std::max<int64_t>(account.samples, 0);
  account.bytes = 0;
  account.samples = 0;
}

void CreditLedger::NoteRequest(CreditAccount& account, const wire::CreditRequest& request) const {
  if (request.bytes() > 0) account.wanted_bytes = std::min<uint64_t>(request.bytes(), max_sample_bytes_);
  if (request.has_seq()) {
    account.wanted_seq = request.seq();
    account.wanted_seq_epoch = request.epoch();
  }
}

bool CreditLedger::MaySend(const CreditAccount& account) {
  // A producer that asked for bytes (its next sample is larger) or for a
  // higher seq limit is held back by the daemon.
  return account.samples > 0 && account.bytes > 0 &&
         (account.wanted_bytes == 0 || account.bytes >= static_cast<int64_t>(account.wanted_bytes)) &&
         !account.wanted_seq;
}

void CreditLedger::NoteIdle(CreditAccount& account, Clock::TimePoint now) {
  if (MaySend(account) && now - account.last_sample > kIdleAfter) account.window.Quiet();
}

uint64_t CreditLedger::WindowBytes(size_t producers) const {
  // Room shared among the producers that said hello; a producer whose next
  // sample is larger asks for it (CreditRequest) and gets it when room allows.
  const uint64_t share = buffer_max_bytes_ / (2 * std::max<size_t>(producers, 1));
  return std::clamp<uint64_t>(share, std::min<uint64_t>(64 << 10, max_sample_bytes_), max_sample_bytes_);
}

int64_t CreditLedger::ShareSamples(size_t producers) const {
  return CreditWindow::Share(buffer_max_samples_, producers, window_samples_);
}

std::optional<CreditGrant> CreditLedger::TopUp(const CreditAccount& account, size_t producers,
                                               const CreditRoom& room) const {
  const uint64_t window = WindowBytes(producers);
  // Bytes follow the samples lent: a producer lent one sample is lent room
  // for about one (a larger one asks, CreditRequest), so idle producers pin
  // no more bytes than samples.
  const int64_t lend = account.window.Samples(ShareSamples(producers));
  const uint64_t per_sample = std::max<uint64_t>(kBytesPerLentSample, account.largest_sample);
  const uint64_t lent_bytes =
      std::min<uint64_t>(window, static_cast<uint64_t>(lend) * std::min<uint64_t>(per_sample, window));
  const int64_t target = static_cast<int64_t>(std::max<uint64_t>(lent_bytes, account.wanted_bytes));
  const int64_t need_bytes = target - account.bytes;
  const int64_t need_samples = lend - account.samples;
  // Top up once half the window is spent (or the producer asked for more,
  // or holds none): one credit message per half window, not one per burst,
  // which for small samples was one message per sample each way.
  const bool low = 2 * need_bytes >= target || 2 * need_samples >= lend || account.samples <= 0 ||
                   account.bytes <= 0 || account.wanted_bytes > 0;
  if (!low || (need_bytes <= 0 && need_samples <= 0)) return std::nullopt;
  // Bytes are topped up only when they run low too: a producer that needs
  // samples but still holds bytes is not charged a byte grant (an ahead
  // producer's held bytes would otherwise block its sample top-ups).
  const bool bytes_low = 2 * need_bytes >= target || account.bytes <= 0 || account.wanted_bytes > 0;
  CreditGrant grant;
  grant.bytes = bytes_low ? std::max<int64_t>(need_bytes, 0) : 0;
  grant.samples = std::max<int64_t>(need_samples, 0);
  if (grant.bytes > room.free_bytes || grant.samples > room.free_samples)
    return std::nullopt;  // wait for room
  if (account.ahead && grant.bytes > 0 && grant.bytes > room.ahead_bytes) return std::nullopt;
  return grant;
}

void CreditLedger::Grant(CreditAccount& account, const CreditGrant& grant, CreditRoom& room) {
  account.bytes += grant.bytes;
  account.samples += grant.samples;
  outstanding_bytes_ += grant.bytes;
  outstanding_samples_ += grant.samples;
  room.free_bytes -= grant.bytes;
  room.free_samples -= grant.samples;
  if (account.ahead) room.ahead_bytes -= grant.bytes;
  if (account.bytes >= static_cast<int64_t>(account.wanted_bytes)) account.wanted_bytes = 0;
}

}  // namespace odb::ingest
