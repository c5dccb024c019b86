#include "src/align/hello.h"

#include <cstring>
#include <optional>
#include <sstream>

#include "proto/peer.pb.h"

namespace odb::align {
namespace {

constexpr char kMagic[4] = {'O', 'D', 'B', 'H'};
constexpr size_t kPrefixBytes = 8;  // the magic, then the version as u32 little-endian

struct Hello {
  uint32_t rank = 0;
  uint32_t world = 0;
  uint64_t fingerprint = 0;
  HelloFields fields;
};

std::string Str(double v) {
  std::ostringstream os;
  os.precision(17);
  os << v;
  return os.str();
}

}  // namespace

HelloFields AlignmentHelloFields(const Planner& planner, int world_size) {
  const PlannerConfig& c = planner.config();
  return {
      {"planner", planner.Name()},
      {"world_size", std::to_string(world_size)},
      {"mode", EpochModeName(c.mode)},
      {"seed", std::to_string(c.seed)},
      {"window", std::to_string(c.window)},
      {"max_wait_rounds", std::to_string(c.max_wait_rounds)},
      {"deterministic", c.deterministic ? "1" : "0"},
      {"tokens_per_step", std::to_string(c.tokens_per_step)},
      {"window_spread", Str(c.window_spread)},
      {"min_free_slots", std::to_string(c.min_free_slots)},
      {"full_rounds", c.full_rounds ? "1" : "0"},
      {"budget.model", c.budget.model == grouping::CostModel::kPadded ? "padded" : "packed"},
      {"budget.max_tokens", std::to_string(c.budget.max_tokens)},
      {"budget.quadratic_q", Str(c.budget.quadratic_q)},
      {"budget.max_group_size", std::to_string(c.budget.max_group_size)},
      {"budget.max_vision_patches", std::to_string(c.budget.max_vision_patches)},
      {"budget.max_audio_frames", std::to_string(c.budget.max_audio_frames)},
      {"step_model.per_step", Str(c.step_model.per_step)},
      {"step_model.per_padded_token", Str(c.step_model.per_padded_token)},
      {"step_model.per_len_sq", Str(c.step_model.per_len_sq)},
  };
}

uint64_t HelloFingerprint(const HelloFields& fields) {
  uint64_t h = 1469598103934665603ULL;
  auto mix = [&h](const std::string& s) {
    for (unsigned char c : s) h = (h ^ c) * 1099511628211ULL;
    h = (h ^ 0xff) * 1099511628211ULL;  // separator
  };
  for (const auto& [k, v] : fields) {
    mix(k);
    mix(v);
  }
  return h;
}

std::string EncodeHello(int rank, int world_size, const HelloFields& fields) {
  peer::Hello h;
  h.set_rank(static_cast<uint32_t>(rank));
  h.set_world_size(static_cast<uint32_t>(world_size));
  h.set_fingerprint(HelloFingerprint(fields));
  for (const auto& [k, v] : fields) {
    h.add_names(k);
    h.add_values(v);
  }
  std::string out(kMagic, 4);
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((kPeerProtocolVersion >> (8 * i)) & 0xff));
  return out + EncodePeerMessage(h);
}

absl::Status CheckHellos(const std::vector<std::string>& hellos) {
  std::vector<std::optional<Hello>> parsed(hellos.size());
  std::string problems;
  bool other_versions = false;  // a rank of another peer protocol version
  auto add = [&problems](const std::string& p) { problems += (problems.empty() ? "" : "; ") + p; };
  for (size_t r = 0; r < hellos.size(); ++r) {
    const std::string& bytes = hellos[r];
    if (bytes.size() < 4 || std::memcmp(bytes.data(), kMagic, 4) != 0) {
      add("rank " + std::to_string(r) + " sent no odb hello (wrong program on that port?)");
      continue;
    }
    if (bytes.size() < kPrefixBytes) {
      add("rank " + std::to_string(r) + " sent a truncated hello");
      continue;
    }
    uint32_t version = 0;
    for (int i = 0; i < 4; ++i)
      version |= static_cast<uint32_t>(static_cast<uint8_t>(bytes[4 + i])) << (8 * i);
    if (version != kPeerProtocolVersion) {
      other_versions = true;
      add("rank " + std::to_string(r) + " speaks peer protocol " + std::to_string(version) + ", this rank " +
          std::to_string(kPeerProtocolVersion) + " (every daemon of a job must run the same odb version)");
      continue;
    }
    peer::Hello p;
    if (absl::Status s = ParsePeerMessage(std::string_view(bytes).substr(kPrefixBytes), "hello", p);
        !s.ok()) {
      add("rank " + std::to_string(r) + " sent a malformed hello (" + std::string(s.message()) + ")");
      continue;
    }
    if (p.names_size() != p.values_size()) {
      add("rank " + std::to_string(r) + " sent a malformed hello (" + std::to_string(p.names_size()) +
          " names, " + std::to_string(p.values_size()) + " values)");
      continue;
    }
    Hello h;
    h.rank = p.rank();
    h.world = p.world_size();
    h.fingerprint = p.fingerprint();
    for (int i = 0; i < p.names_size(); ++i) h.fields.emplace_back(p.names(i), p.values(i));
    if (HelloFingerprint(h.fields) != h.fingerprint) {
      add("rank " + std::to_string(r) + " sent a corrupt hello (its fields do not match its fingerprint)");
      continue;
    }
    if (h.rank != r) add("slot " + std::to_string(r) + " holds a hello from rank " + std::to_string(h.rank));
    if (h.world != hellos.size()) {
      add("rank " + std::to_string(r) + " has world_size=" + std::to_string(h.world) + " but " +
          std::to_string(hellos.size()) + " ranks joined");
    }
    parsed[r] = std::move(h);
  }
  if (!parsed.empty() && parsed[0]) {
    const Hello& ref = *parsed[0];
    for (size_t r = 1; r < parsed.size(); ++r) {
      if (!parsed[r] || parsed[r]->fingerprint == ref.fingerprint) continue;
      const Hello& h = *parsed[r];
      bool named = false;
      for (const auto& [k, v] : h.fields) {
        std::optional<std::string> refv;
        for (const auto& [rk, rv] : ref.fields) {
          if (rk == k) refv = rv;
        }
        if (!refv) {
          add("rank " + std::to_string(r) + " has field " + k + "=" + v + " that rank 0 lacks");
          named = true;
        } else if (*refv != v) {
          add("rank " + std::to_string(r) + " has " + k + "=" + v + " but rank 0 has " + k + "=" + *refv);
          named = true;
        }
      }
      for (const auto& [rk, rv] : ref.fields) {
        bool found = false;
        for (const auto& kv : h.fields) found = found || kv.first == rk;
        if (!found) {
          add("rank " + std::to_string(r) + " lacks field " + rk + " (rank 0 has " + rk + "=" + rv + ")");
          named = true;
        }
      }
      if (!named) add("rank " + std::to_string(r) + " has a different field order than rank 0");
    }
  }
  if (problems.empty()) return absl::OkStatus();
  if (other_versions) {
    return absl::FailedPreconditionError(
        "daemons of different odb versions in one job (run one odbd build on "
        "every rank): " +
        problems);
  }
  return absl::FailedPreconditionError("alignment config mismatch between daemons (fix the config so all ranks "
                                       "agree): " + problems);
}

absl::Status ExchangeHello(PeerGroup& peers, const HelloFields& fields) {
  auto gathered = peers.AllGather(EncodeHello(peers.Rank(), peers.Size(), fields));
  if (!gathered.ok()) return gathered.status();
  absl::Status s = CheckHellos(*gathered);
  if (!s.ok()) {
    return absl::FailedPreconditionError(s.message());  // the daemon's log line names this rank
  }
  return s;
}

}  // namespace odb::align
