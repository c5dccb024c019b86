#ifndef ODB_COMMON_FD_BUDGET_H_
#define ODB_COMMON_FD_BUDGET_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace odb {

// File descriptors are a resource like memory: odbd raises its limit at start,
// sizes what it accepts from it, and running out is a named, counted refusal
// of one connection, never an abort.
//
// Why a guard around accept(): libzmq's ipc listener asserts (aborts the
// process) when accept() fails with EMFILE, and its TCP listener spins on it;
// neither can be told to stop accepting near the limit. So odbd interposes
// accept()/accept4() (this unit defines them; the dynamic linker binds
// libzmq's calls to odbd's definitions): once the budget is installed, a
// connection whose descriptor would eat into the reserve, or that arrives
// when no descriptor is left at all, is accepted and closed at once and
// reported to the caller as ECONNABORTED, which every listener in the process
// (libzmq's ipc and tcp listeners, Gloo's, odbd's own) treats as "the peer
// gave up": the client sees its connection closed and retries later, and
// connections already open are served to the end.

struct DescriptorLimit {
  uint64_t soft_before = 0;  // RLIMIT_NOFILE's soft limit as the process got it
  uint64_t soft = 0;         // after raising it to the hard limit
  uint64_t hard = 0;
};

// Raises RLIMIT_NOFILE's soft limit to its hard limit (a service started with
// 1,024 usually may have far more) and says what it was.
absl::StatusOr<DescriptorLimit> RaiseDescriptorLimit();

struct DescriptorBudget {
  uint64_t limit = 0;            // descriptors the process may hold
  uint64_t reserve = 0;          // kept free for the daemon's own work
  uint64_t max_connections = 0;  // limit - reserve: connections accepted at most
};
// The reserve is an eighth of the limit and at least 32 (arenas, peers, logs,
// ZeroMQ's own descriptors and one connection accepted per listener at once).
DescriptorBudget BudgetFor(uint64_t limit);

// From now on, accepting a connection never exhausts descriptors (see above).
// Idempotent; the last budget wins.
void InstallAcceptGuard(const DescriptorBudget& budget);
// The installed budget's max_connections, or UINT64_MAX with no guard.
uint64_t MaxConnectionsByDescriptors();
// Connections refused so far for want of descriptors (for metrics).
uint64_t ConnectionsRefusedForDescriptors();
// The descriptors this process holds now (a count of /proc/self/fd).
uint64_t OpenDescriptors();

// At start: raises the limit, installs the guard for it, logs both limits
// and the budget. What odbd's main calls.
void SetUpDescriptorBudget();

// The kernel's accept4(), never refused by the guard: for a listener that
// bounds its own connections and handles EMFILE itself (the metrics server,
// so that the counters stay readable while producers exhaust descriptors).
// What it takes can eat into the reserve; the guard's EMFILE path still keeps
// every other listener from aborting.
int AcceptOutsideBudget(int listen_fd, int flags);

// Test seam: the accept guard's decision for a descriptor `fd` just accepted
// (true: close it and refuse the connection).
bool AcceptGuardRefuses(int fd);

}  // namespace odb

#endif  // ODB_COMMON_FD_BUDGET_H_
