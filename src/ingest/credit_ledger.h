#ifndef ODB_INGEST_CREDIT_LEDGER_H_
#define ODB_INGEST_CREDIT_LEDGER_H_

#include <cstdint>
#include <optional>

#include "proto/odb.pb.h"
#include "src/common/clock.h"
#include "src/ingest/credit_window.h"

namespace odb::ingest {

// What one producer connection holds and asks for. Owned by the channel (one
// per connection); the ledger moves credit in and out of it.
struct CreditAccount {
  int64_t samples = 0;  // granted and not yet used
  int64_t bytes = 0;
  CreditWindow window;                 // how many samples it is lent (grows while it sends)
  Clock::TimePoint last_sample;        // its last sample (or its first message)
  uint64_t largest_sample = 0;         // charged bytes of its largest sample so far
  bool ahead = false;                  // sends an epoch after the one being planned
  uint64_t wanted_bytes = 0;           // a credit request: its next sample's size
  std::optional<uint64_t> wanted_seq;  // its next sample's seq, held at the seq limit
  uint32_t wanted_seq_epoch = 0;
};

// The room a grant pass may lend: what the buffer can still take beyond the
// credit already out, and (for producers ahead of the planned epoch) what is
// left of the half of the buffer they may use. A pass spends it.
struct CreditRoom {
  int64_t free_bytes = 0;
  int64_t free_samples = 0;
  int64_t ahead_bytes = 0;
};

// One top-up for one account.
struct CreditGrant {
  int64_t bytes = 0;
  int64_t samples = 0;
};

// The ingest credit ledger: the totals of credit granted and not yet used,
// and the rules by which credit is charged, topped up and returned. Socket-
// free and lock-free (the channel owns it on its I/O thread; the buffer's
// room is read by the caller under DaemonState::mu), so that flow control has
// its own test.
//
// Invariant: outstanding_bytes()/outstanding_samples() are the sums of the
// positive credit of the accounts, as long as every account's credit moves
// only through Charge/Grant/Release.
class CreditLedger {
 public:
  // `buffer_max_*`: buffer.max_bytes / buffer.max_samples; a sample may take
  // at most half of max_bytes (max_sample_bytes()).
  CreditLedger(uint64_t buffer_max_bytes, uint64_t buffer_max_samples);

  uint64_t max_sample_bytes() const { return max_sample_bytes_; }
  int64_t outstanding_bytes() const { return outstanding_bytes_; }
  int64_t outstanding_samples() const { return outstanding_samples_; }

  // A sample of `bytes` arrived: false (nothing charged) when the account
  // lacks a sample or the bytes of credit for it.
  bool Charge(CreditAccount& account, uint64_t bytes, Clock::TimePoint now);
  // The account's credit returns to the buffer (its stream ended, or its
  // producer is gone).
  void Release(CreditAccount& account);
  // The producer asked for credit: bytes for a larger next sample (at most
  // max_sample_bytes()), or, in seq order, a higher seq limit.
  void NoteRequest(CreditAccount& account, const wire::CreditRequest& request) const;

  // Credit for a sample and not waiting for more (a larger byte grant or a
  // higher seq limit): the producer may send now.
  static bool MaySend(const CreditAccount& account);
  // A producer that could send and sent nothing for a second is lent one
  // sample again (its top-ups stop).
  static void NoteIdle(CreditAccount& account, Clock::TimePoint now);

  // The byte window one of `producers` connections is lent, and the samples
  // window (CreditWindow::Share of the samples cap).
  uint64_t WindowBytes(size_t producers) const;
  int64_t ShareSamples(size_t producers) const;

  // The top-up `account` gets now (nullopt: none, it holds enough or the room
  // is not there yet). Once half its window is spent, not per sample: one
  // credit message per half window each way.
  std::optional<CreditGrant> TopUp(const CreditAccount& account, size_t producers,
                                   const CreditRoom& room) const;
  // Lends `grant` to `account`, spending `room`.
  void Grant(CreditAccount& account, const CreditGrant& grant, CreditRoom& room);

 private:
  uint64_t buffer_max_bytes_;
  uint64_t buffer_max_samples_;
  uint64_t max_sample_bytes_;
  uint64_t window_samples_;
  int64_t outstanding_bytes_ = 0;    // Σ positive account bytes
  int64_t outstanding_samples_ = 0;  // Σ positive account samples
};

}  // namespace odb::ingest

#endif  // ODB_INGEST_CREDIT_LEDGER_H_
