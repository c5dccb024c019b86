#ifndef ODB_SHM_PROCESS_H_
#define ODB_SHM_PROCESS_H_

#include <sys/types.h>

#include <cstdint>

namespace odb::shm {

// Process identity for liveness checks across processes that share a segment.
// A pid alone is reused by the kernel after its process dies, so a segment also
// records the process's start time (field 22 of /proc/<pid>/stat, clock ticks
// since boot): a live process with the same pid but another start time is a
// different process, and the segment's owner counts as dead.

// The start time of `pid` in clock ticks since boot, or 0 when the process does
// not exist (or /proc is not mounted).
uint64_t ProcessStartTicks(pid_t pid);

// Whether `pid` runs and, when `start_ticks` is non-zero, is the process that
// started at that time. Zombies (killed, not yet reaped) count as dead. Without
// /proc it falls back to kill(pid, 0) and cannot see pid reuse.
bool IsProcessAlive(pid_t pid, uint64_t start_ticks);

}  // namespace odb::shm

#endif  // ODB_SHM_PROCESS_H_
