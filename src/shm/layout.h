#ifndef ODB_SHM_LAYOUT_H_
#define ODB_SHM_LAYOUT_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace odb::shm {

// The byte layout of an arena segment, shared by every process that maps it
// (docs/shm.md draws it). All integers are native-endian: a segment never
// leaves its host.
//
//   [0, 4096)                       ArenaHeader (one page)
//   [cq_offset, + cq_capacity*32)   completion queue entries, page-rounded
//   [data_offset, total_bytes)      data region: the blocks, 64-byte aligned
//
// Offsets in descriptors and completion entries are from the start of the
// segment, so both sides compute the same address as base + offset.

inline constexpr uint64_t kArenaMagic = 0x314d48535f42444fULL;  // "ODB_SHM1" in memory order
inline constexpr uint32_t kArenaLayoutVersion = 1;
inline constexpr uint64_t kArenaHeaderBytes = 4096;
inline constexpr uint64_t kBlockAlignment = 64;
inline constexpr char kArenaFilePrefix[] = "odb-shm-";

// writer_state values.
inline constexpr uint32_t kWriterLive = 1;
inline constexpr uint32_t kWriterClosed = 2;  // the creator closed it cleanly

// One returned block. Written by the reader into a slot it owns, published by
// the release store of cq_tail, read by the writer after an acquire load.
struct CompletionEntry {
  uint64_t offset;
  uint64_t length;
  uint64_t epoch;  // the reader epoch it was returned under; older ones are dropped after a Reset
  uint64_t reserved;
};
static_assert(sizeof(CompletionEntry) == 32);

// Fields above `writer_state` are written once by the creator before it
// publishes `magic` (release) and are read-only afterwards. The fields below
// are atomics in the mapping (accessed with std::atomic_ref), each group on its
// own cache line so the two processes do not false-share. The lines are placed
// by explicit padding, not alignas, so a copy of the header on the stack or in
// a buffer (pread before mapping) needs no more than 8-byte alignment; in the
// mapping it starts on a page.
struct ArenaHeader {
  // --- identity, immutable once magic is set (cache lines 0 and 1) ---
  uint64_t magic;           // kArenaMagic, stored last (release) when the segment is ready
  uint32_t layout_version;  // kArenaLayoutVersion
  uint32_t header_bytes;    // kArenaHeaderBytes
  uint64_t total_bytes;     // the segment's size; must equal the file's size
  uint64_t generation;      // random 64-bit nonce; also in the file name
  int32_t creator_pid;
  uint32_t creator_uid;
  uint64_t creator_start_ticks;  // /proc/<pid>/stat start time: pid reuse is not mistaken for the creator
  uint64_t cq_offset;
  uint32_t cq_capacity;  // entries, a power of two; also the most blocks outstanding at once
  uint32_t block_alignment;
  uint64_t data_offset;  // page aligned
  uint64_t data_bytes;
  uint8_t reserved0[48];
  // --- liveness and the reader claim (cache line 2, offset 128) ---
  uint32_t writer_state;  // kWriterLive, then kWriterClosed
  int32_t reader_pid;     // 0: no reader; CAS-claimed by ArenaReader
  uint64_t reader_start_ticks;
  uint32_t reader_epoch;  // bumped by the writer's Reset; a reader's returns carry its epoch
  uint8_t reserved1[44];
  // --- completion queue consumer side, written by the writer (cache line 3, offset 192) ---
  uint64_t cq_head;
  uint32_t writer_waiting;  // 1 while the writer may sleep on cq_seq
  uint8_t reserved2[52];
  // --- completion queue producer side, written by the reader (cache line 4, offset 256) ---
  uint64_t cq_tail;
  uint32_t cq_seq;  // futex word: bumped after every push
  uint8_t reserved3[52];
};
static_assert(std::is_standard_layout_v<ArenaHeader> && std::is_trivially_copyable_v<ArenaHeader>);
static_assert(sizeof(ArenaHeader) == 320 && sizeof(ArenaHeader) <= kArenaHeaderBytes);
static_assert(offsetof(ArenaHeader, writer_state) == 128);
static_assert(offsetof(ArenaHeader, cq_head) == 192);
static_assert(offsetof(ArenaHeader, cq_tail) == 256);
static_assert(offsetof(ArenaHeader, reader_start_ticks) % 8 == 0 && offsetof(ArenaHeader, cq_seq) % 4 == 0);
static_assert(std::atomic_ref<uint64_t>::is_always_lock_free &&
                  std::atomic_ref<uint32_t>::is_always_lock_free,
              "cross-process atomics must be lock-free (address-free)");

template <typename T>
std::atomic_ref<T> Atomic(T& field) {
  return std::atomic_ref<T>(field);
}

}  // namespace odb::shm

#endif  // ODB_SHM_LAYOUT_H_
