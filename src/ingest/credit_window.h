#ifndef ODB_INGEST_CREDIT_WINDOW_H_
#define ODB_INGEST_CREDIT_WINDOW_H_

#include <algorithm>
#include <cstdint>

namespace odb::ingest {

// How many samples of credit one producer connection is lent: credit goes to
// producers that send. A producer that said hello and has not sent is lent
// one sample (enough to start; a DataLoader worker that never sends pins
// nothing more). Each time it uses its whole window the window doubles, up
// to `cap`, so a busy producer reaches the full window within a few grants;
// a producer that goes quiet (Quiet()) falls back to one sample, so its
// top-ups stop and the credit it no longer uses is lent to others as the
// buffer drains. Socket-free and clock-free (the caller says when a producer
// is quiet) so that the policy has its own test.
class CreditWindow {
 public:
  // The window now, at most `cap` (>= 1).
  int64_t Samples(int64_t cap) const { return std::clamp<int64_t>(window_, 1, std::max<int64_t>(cap, 1)); }
  // The producer used one sample of credit.
  void OnSampleUsed() {
    if (++used_ < window_) return;
    used_ = 0;
    window_ = std::min<int64_t>(window_ * 2, kMaxWindow);
  }
  // The producer sent nothing for a while: back to one sample.
  void Quiet() {
    window_ = 1;
    used_ = 0;
  }

  // The samples window a producer may be lent when `producers` share a buffer
  // of `max_samples`: half the buffer among them, so that what producers hold
  // never keeps the buffer from others; at least 1, at most `per_producer_cap`.
  static int64_t Share(uint64_t max_samples, uint64_t producers, uint64_t per_producer_cap) {
    const uint64_t share = max_samples / (2 * std::max<uint64_t>(producers, 1));
    return static_cast<int64_t>(std::clamp<uint64_t>(share, 1, std::max<uint64_t>(per_producer_cap, 1)));
  }

  static constexpr int64_t kMaxWindow = int64_t{1} << 20;

 private:
  int64_t window_ = 1;
  int64_t used_ = 0;
};

}  // namespace odb::ingest

#endif  // ODB_INGEST_CREDIT_WINDOW_H_
