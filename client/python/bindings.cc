// _odb_native: pybind11 bindings of the C++ client (odb/producer.h,
// odb/consumer.h). The wire protocol lives only in C++; Python adds the
// PyTorch conveniences (client/python/odb/).
//
// Zero copy on the way out: a received step's tensors are numpy arrays whose
// data pointer is the received ZeroMQ frame itself, or, with the step arena,
// the step's block in the daemon's shared memory (64-byte aligned). When the
// last array of a step (and the Delivery) is gone, its block goes back to the
// daemon: the capsule's destructor may run on any thread, the return is
// locked in the client. Each array's base is a
// capsule holding a shared_ptr to the Delivery, so the frames stay alive for as
// long as any array (or torch tensor made with torch.from_numpy) refers to them.
//
// Blocking calls (Connect, Send, EndStream, Next) release the GIL. Every error
// Status becomes odb.OdbError (or OdbTimeout for DeadlineExceeded) carrying the
// C++ message.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "odb/consumer.h"
#include "odb/producer.h"
#include "odb/types.h"

namespace py = pybind11;

namespace odb::client {
namespace {

// Python exception types, created in the module init below.
PyObject* g_odb_error = nullptr;
PyObject* g_odb_timeout = nullptr;

[[noreturn]] void Raise(const absl::Status& status) {
  PyObject* type = status.code() == absl::StatusCode::kDeadlineExceeded ? g_odb_timeout : g_odb_error;
  PyErr_SetString(type, std::string(status.message()).c_str());
  throw py::error_already_set();
}

void Check(const absl::Status& status) {
  if (!status.ok()) Raise(status);
}

// numpy dtype for a wire dtype; bfloat16 has no numpy type and travels as
// uint16 (Python reinterprets it with torch's .view(torch.bfloat16)).
py::dtype NumpyDType(DType dtype) {
  switch (dtype) {
    case DType::kUInt8: return py::dtype::of<uint8_t>();
    case DType::kInt8: return py::dtype::of<int8_t>();
    case DType::kInt16: return py::dtype::of<int16_t>();
    case DType::kInt32: return py::dtype::of<int32_t>();
    case DType::kInt64: return py::dtype::of<int64_t>();
    case DType::kFloat16: return py::dtype("float16");
    case DType::kBFloat16: return py::dtype::of<uint16_t>();
    case DType::kFloat32: return py::dtype::of<float>();
    case DType::kFloat64: return py::dtype::of<double>();
    case DType::kBool: return py::dtype::of<bool>();
  }
  throw py::value_error("unknown odb dtype code " + std::to_string(static_cast<int>(dtype)));
}

py::dict RejectionDict(const Rejection& r) {
  py::dict d;
  d["code"] = r.code;
  d["sample_id"] = r.has_sample_id ? py::object(py::int_(r.sample_id)) : py::object(py::none());
  d["producer_id"] = r.producer_id;
  d["message"] = r.message;
  return d;
}

py::list Rejections(const std::vector<Rejection>& rs) {
  py::list out;
  for (const auto& r : rs) out.append(RejectionDict(r));
  return out;
}

// One received message. Shared with every array made from it.
class PyDelivery {
 public:
  explicit PyDelivery(Delivery d) : d_(std::make_shared<Delivery>(std::move(d))) {}

  bool is_step() const { return d_->kind == Delivery::Kind::kStep; }
  const Delivery& get() const { return *d_; }

  const TensorView& View(const std::string& name) const {
    const TensorView* v = d_->Find(name);
    if (v == nullptr) throw py::key_error("the step carries no tensor '" + name + "'");
    return *v;
  }

  // A numpy array over the frame, no copy. Writable: the frame is this
  // delivery's own memory, nobody else reads it.
  py::array Array(const std::string& name) const {
    const TensorView& v = View(name);
    py::dtype dt = NumpyDType(v.dtype);
    const size_t item = static_cast<size_t>(dt.itemsize());
    size_t numel = 1;
    for (int64_t s : v.shape) numel *= static_cast<size_t>(s);
    if (numel * item != v.size_bytes) {
      throw py::value_error("tensor '" + name + "': frame has " + std::to_string(v.size_bytes) +
                            " bytes, shape needs " + std::to_string(numel * item));
    }
    std::vector<py::ssize_t> strides(v.shape.size());
    py::ssize_t stride = static_cast<py::ssize_t>(item);
    for (size_t i = v.shape.size(); i-- > 0;) {
      strides[i] = stride;
      stride *= static_cast<py::ssize_t>(v.shape[i]);
    }
    auto* keep = new std::shared_ptr<Delivery>(d_);
    py::capsule base(keep, [](void* p) { delete static_cast<std::shared_ptr<Delivery>*>(p); });
    std::vector<py::ssize_t> shape(v.shape.begin(), v.shape.end());
    return py::array(dt, shape, strides, const_cast<uint8_t*>(v.data), base);
  }

  py::list TensorNames() const {
    py::list out;
    for (const auto& t : d_->tensors) out.append(t.name);
    return out;
  }

  py::dict Tensors() const {
    py::dict out;
    for (const auto& t : d_->tensors) out[py::str(t.name)] = Array(t.name);
    return out;
  }

  int WireDType(const std::string& name) const { return static_cast<int>(View(name).dtype); }
  uintptr_t FrameAddress(const std::string& name) const {
    return reinterpret_cast<uintptr_t>(View(name).data);
  }
  size_t FrameBytes(const std::string& name) const { return View(name).size_bytes; }

 private:
  std::shared_ptr<Delivery> d_;
};

std::vector<int64_t> ToVector(const py::iterable& shape) {
  std::vector<int64_t> out;
  for (auto s : shape) out.push_back(s.cast<int64_t>());
  return out;
}

class PyProducer {
 public:
  PyProducer(const std::string& endpoint, const std::string& producer_id, int rank, int send_hwm,
             int send_timeout_ms, const std::string& data_plane, uint64_t arena_bytes, uint64_t shm_min_bytes) {
    ProducerOptions o;
    o.endpoint = endpoint;
    o.producer_id = producer_id;
    o.rank = rank;
    o.send_hwm = send_hwm;
    o.send_timeout_ms = send_timeout_ms;
    absl::StatusOr<DataPlane> plane = ParseDataPlane(data_plane);
    if (!plane.ok()) throw py::value_error(std::string(plane.status().message()));
    o.data_plane = *plane;
    o.arena_bytes = arena_bytes;
    o.shm_min_bytes = shm_min_bytes;
    absl::StatusOr<std::unique_ptr<Producer>> p;
    {
      py::gil_scoped_release release;
      p = Producer::Connect(o);
    }
    if (!p.ok()) Raise(p.status());
    producer_ = std::move(*p);
  }

  void StartEpoch(uint32_t epoch) {
    absl::Status s;
    {
      py::gil_scoped_release release;
      s = producer_->StartEpoch(epoch);
    }
    Check(s);
  }

  // tensors: sequence of (name, dtype_code, shape, buffer). Each buffer must be
  // C-contiguous with exactly numel * dtype bytes; it is read during the call.
  void Send(uint64_t sample_id, uint32_t epoch, uint32_t tokens, uint32_t vision_patches,
            uint32_t audio_frames, const py::sequence& tensors, std::optional<uint64_t> seq,
            std::optional<uint32_t> loss_tokens) {
    std::vector<py::buffer_info> infos;
    std::vector<TensorInput> inputs;
    infos.reserve(tensors.size());
    for (auto item : tensors) {
      auto t = item.cast<py::tuple>();
      if (t.size() != 4) throw py::value_error("each tensor is (name, dtype_code, shape, buffer)");
      TensorInput in;
      in.name = t[0].cast<std::string>();
      in.dtype = static_cast<DType>(t[1].cast<int>());
      in.shape = ToVector(t[2].cast<py::iterable>());
      infos.push_back(t[3].cast<py::buffer>().request());
      const py::buffer_info& info = infos.back();
      if (!PyBuffer_IsContiguous(info.view(), 'C')) {
        throw py::value_error("tensor '" + in.name + "' is not C-contiguous");
      }
      in.data = info.ptr;
      in.size_bytes = static_cast<size_t>(info.size * info.itemsize);
      size_t numel = 1;
      for (int64_t s : in.shape) numel *= static_cast<size_t>(s);
      if (DTypeBytes(in.dtype) == 0) {
        throw py::value_error("tensor '" + in.name + "': unknown dtype code " +
                              std::to_string(static_cast<int>(in.dtype)));
      }
      if (numel * DTypeBytes(in.dtype) != in.size_bytes) {
        throw py::value_error("tensor '" + in.name + "': buffer has " + std::to_string(in.size_bytes) +
                              " bytes, shape and dtype need " +
                              std::to_string(numel * DTypeBytes(in.dtype)));
      }
      inputs.push_back(std::move(in));
    }
    absl::Status s;
    {
      py::gil_scoped_release release;
      s = producer_->Send(sample_id, epoch, {tokens, vision_patches, audio_frames, loss_tokens}, inputs, seq);
    }
    Check(s);
  }

  void Cancel() { producer_->Cancel(); }

  void EndStream(uint32_t epoch) {
    absl::Status s;
    {
      py::gil_scoped_release release;
      s = producer_->EndStream(epoch);
    }
    Check(s);
  }

  void SendRawFrames(const std::vector<py::bytes>& frames) {
    std::vector<std::string> f;
    for (const auto& b : frames) f.push_back(std::string(b));
    absl::Status s;
    {
      py::gil_scoped_release release;
      s = producer_->SendRawFrames(f);
    }
    Check(s);
  }

  uint64_t Sent(uint32_t epoch) const { return producer_->sent(epoch); }
  std::string DataPlaneInUse() const { return DataPlaneName(producer_->data_plane()); }
  uint64_t ArenaId() const { return producer_->arena_id(); }
  std::string ArenaNote() const { return producer_->arena_note(); }
  py::object ArenaStatsDict() const {
    const std::optional<ArenaStats> s = producer_->arena_stats();
    if (!s) return py::none();
    py::dict d;
    d["capacity_bytes"] = s->capacity_bytes;
    d["allocations"] = s->allocations;
    d["returns"] = s->returns;
    d["waits"] = s->waits;
    d["outstanding_blocks"] = s->outstanding_blocks;
    d["outstanding_bytes"] = s->outstanding_bytes;
    return d;
  }

 private:
  std::unique_ptr<Producer> producer_;
};

class PyConsumer {
 public:
  PyConsumer(const std::string& endpoint, int receive_timeout_ms, const std::string& data_plane) {
    ConsumerOptions o;
    o.endpoint = endpoint;
    o.receive_timeout_ms = receive_timeout_ms;
    o.data_plane = data_plane;
    auto c = Consumer::Connect(o);
    if (!c.ok()) Raise(c.status());
    consumer_ = std::move(*c);
  }

  // Closes the connection now (the daemon sees the session end), not when the
  // last reference goes: a traceback can keep this object alive for long.
  void Close() { consumer_.reset(); }

  void StartEpoch(uint32_t epoch, uint32_t expected_producers, uint64_t first_round, uint64_t first_step) {
    Check(Live()->StartEpoch(epoch, expected_producers, first_round, first_step));
  }

  PyDelivery Next() {
    absl::StatusOr<Delivery> d;
    {
      py::gil_scoped_release release;
      d = Live()->Next();
    }
    if (!d.ok()) Raise(d.status());
    return PyDelivery(std::move(*d));
  }

  void ReportDataWait(double seconds) {
    if (!(seconds > 0.0)) return;  // NaN and negatives count as no wait
    Live()->ReportDataWait(std::chrono::microseconds(static_cast<int64_t>(std::min(seconds, 1e12) * 1e6)));
  }

  void StartEpochLostForTest(uint32_t epoch, uint32_t expected_producers) {
    Check(Live()->StartEpochLostForTest(epoch, expected_producers));
  }
  void ReconnectForTest() { Check(Live()->ReconnectForTest()); }
  uint64_t Reconnects() const { return Live()->reconnects(); }

  py::object JobSettingsDict(std::optional<int> timeout_ms) {
    absl::StatusOr<std::optional<JobSettings>> s;
    {
      py::gil_scoped_release release;
      s = Live()->job_settings(timeout_ms);
    }
    if (!s.ok()) Raise(s.status());
    if (!s->has_value()) return py::none();
    py::dict d;
    d["tokens_per_step"] = (*s)->tokens_per_step;
    d["packed"] = (*s)->packed;
    d["trainer_data_plane"] = (*s)->trainer_data_plane;
    d["length_field"] = (*s)->length_field;
    d["ignore_index"] =
        (*s)->ignore_index ? py::object(py::int_(*(*s)->ignore_index)) : py::object(py::none());
    return d;
  }

  std::string DataPlaneInUse() const { return Live()->data_plane(); }
  std::string ArenaNote() const { return Live()->arena_note(); }
  py::object StepArenaStatsDict() const {
    const std::optional<StepArenaStats> s = Live()->step_arena_stats();
    if (!s) return py::none();
    py::dict d;
    d["generation"] = s->generation;
    d["capacity_bytes"] = s->capacity_bytes;
    d["held_steps"] = s->held_steps;
    d["returned_steps"] = s->returned_steps;
    d["return_failures"] = s->return_failures;
    return d;
  }

 private:
  Consumer* Live() const {
    if (!consumer_) throw std::runtime_error("this odb Consumer is closed (close() was called)");
    return consumer_.get();
  }
  std::unique_ptr<Consumer> consumer_;
};

py::dict SummaryDict(const PyDelivery& pd) {
  const EpochSummary& s = pd.get().summary;
  py::dict d;
  d["epoch"] = s.epoch;
  d["received"] = s.received;
  d["emitted"] = s.emitted;
  d["rejected"] = s.rejected;
  d["steps"] = s.steps;
  d["idle_steps"] = s.idle_steps;
  d["real_tokens"] = s.real_tokens;
  d["padded_tokens"] = s.padded_tokens;
  d["rejections"] = Rejections(s.rejections);
  d["not_emitted_ids"] = s.not_emitted_ids;
  d["rejections_are_errors"] = s.rejections_are_errors;
  return d;
}

}  // namespace
}  // namespace odb::client

PYBIND11_MODULE(_odb_native, m) {
  using namespace odb::client;
  m.doc() = "odb native client (pybind11 over //client/cpp:odb_client)";

  static py::exception<std::runtime_error> odb_error(m, "OdbError");
  g_odb_error = odb_error.ptr();
  static py::exception<std::runtime_error> odb_timeout(m, "OdbTimeout", odb_error.ptr());
  g_odb_timeout = odb_timeout.ptr();

  py::dict dtypes;
  dtypes["uint8"] = static_cast<int>(DType::kUInt8);
  dtypes["int8"] = static_cast<int>(DType::kInt8);
  dtypes["int16"] = static_cast<int>(DType::kInt16);
  dtypes["int32"] = static_cast<int>(DType::kInt32);
  dtypes["int64"] = static_cast<int>(DType::kInt64);
  dtypes["float16"] = static_cast<int>(DType::kFloat16);
  dtypes["bfloat16"] = static_cast<int>(DType::kBFloat16);
  dtypes["float32"] = static_cast<int>(DType::kFloat32);
  dtypes["float64"] = static_cast<int>(DType::kFloat64);
  dtypes["bool"] = static_cast<int>(DType::kBool);
  m.attr("DTYPES") = dtypes;

  py::class_<PyProducer>(m, "Producer", "Sends samples to one daemon. Create it after fork.")
      .def(py::init<const std::string&, const std::string&, int, int, int, const std::string&, uint64_t,
                    uint64_t>(),
           py::arg("endpoint"), py::arg("producer_id"), py::arg("rank") = -1, py::arg("send_hwm") = 64,
           py::arg("send_timeout_ms") = 120000, py::arg("data_plane") = "auto",
           py::arg("arena_bytes") = uint64_t{256} << 20, py::arg("shm_min_bytes") = uint64_t{16} << 10,
           "data_plane: 'auto' (a shared-memory arena when the daemon is local, for samples of at least "
           "shm_min_bytes), 'shm' (always the arena; an error if unavailable) or 'zmq' (frames only); "
           "arena_bytes: the arena's capacity (docs/shm.md)")
      .def("start_epoch", &PyProducer::StartEpoch, py::arg("epoch"))
      .def("send", &PyProducer::Send, py::arg("sample_id"), py::arg("epoch"), py::arg("tokens"),
           py::arg("vision_patches") = 0, py::arg("audio_frames") = 0, py::arg("tensors"),
           py::arg("seq") = py::none(), py::arg("loss_tokens") = py::none(),
           "tensors: sequence of (name, dtype_code, shape, buffer); seq: the sample's position in this "
           "rank's list for the epoch (required by alignment.deterministic); loss_tokens: its labels not "
           "equal to the ignore index (<= tokens; None: every token bears loss)")
      .def("end_stream", &PyProducer::EndStream, py::arg("epoch"))
      .def("cancel", &PyProducer::Cancel,
           "Makes a blocked send/end_stream raise within ~100 ms (callable from another thread)")
      .def("send_raw_frames", &PyProducer::SendRawFrames, py::arg("frames"))
      .def("sent", &PyProducer::Sent, py::arg("epoch"))
      .def_property_readonly("data_plane", &PyProducer::DataPlaneInUse,
                             "'shm' when an arena is registered with the daemon, else 'zmq'")
      .def_property_readonly("arena_id", &PyProducer::ArenaId, "the registered arena's id, 0 without one")
      .def_property_readonly("arena_note", &PyProducer::ArenaNote, "why there is no arena ('' with one)")
      .def("arena_stats", &PyProducer::ArenaStatsDict,
           "the arena's counters (capacity_bytes, allocations, returns, waits, outstanding_blocks, "
           "outstanding_bytes), or None without an arena");

  // The daemon's step header as a typed class (attributes with docstrings);
  // `info["name"]` and `info.get("name")` still work for code written against
  // the earlier dict.
  auto dict_like = [](auto& cls) {
    cls.def("__getitem__",
            [](py::object self, const std::string& key) {
              if (key.empty() || key[0] == '_' || !py::hasattr(self, key.c_str())) throw py::key_error(key);
              return self.attr(key.c_str());
            })
        .def(
            "get",
            [](py::object self, const std::string& key, py::object fallback) {
              if (key.empty() || key[0] == '_' || !py::hasattr(self, key.c_str())) return fallback;
              return py::object(self.attr(key.c_str()));
            },
            py::arg("key"), py::arg("default") = py::none());
  };
  py::class_<Rejection> rejection(m, "Rejection", "An input the daemon refused, with the reason.");
  rejection.def_readonly("code", &Rejection::code, "error code name, e.g. \"TOKENS_MISMATCH\"")
      .def_property_readonly(
          "sample_id",
          [](const Rejection& r) { return r.has_sample_id ? py::object(py::int_(r.sample_id)) : py::object(py::none()); },
          "the sample's id, or None when the input was not a readable sample")
      .def_readonly("producer_id", &Rejection::producer_id)
      .def_readonly("message", &Rejection::message, "what was wrong and what to do")
      .def("__repr__", [](const Rejection& r) { return "Rejection(" + r.code + ": " + r.message + ")"; });
  dict_like(rejection);
  py::class_<StepInfo> step_info(m, "StepInfo", "One step's header, as the daemon sent it (see docs/protocol.md).");
#define ODB_BIND_STEP_FIELD(type, name, dflt, doc) step_info.def_readonly(#name, &StepInfo::name, doc);
#define ODB_BIND_SAMPLE_FIELD(type, name, value, always, doc) ODB_BIND_STEP_FIELD(type, name, value, doc)
#define ODB_BIND_OPTIONAL_SAMPLE_FIELD(type, name, present, value, doc) \
  ODB_BIND_STEP_FIELD(type, name, value, doc)
#define ODB_BIND_ROUTE_FIELDS(type, vision, audio, llm_order, value, doc) \
  ODB_BIND_STEP_FIELD(type, vision, value, doc) ODB_BIND_STEP_FIELD(type, audio, value, doc)
  ODB_STEP_FIELDS(ODB_BIND_STEP_FIELD)
  ODB_STEP_JOB_FIELDS(ODB_BIND_STEP_FIELD)
  ODB_STEP_SAMPLE_FIELDS(ODB_BIND_SAMPLE_FIELD, ODB_BIND_OPTIONAL_SAMPLE_FIELD)
  ODB_STEP_ROUTE_FIELDS(ODB_BIND_ROUTE_FIELDS)
#undef ODB_BIND_ROUTE_FIELDS
#undef ODB_BIND_OPTIONAL_SAMPLE_FIELD
#undef ODB_BIND_SAMPLE_FIELD
#undef ODB_BIND_STEP_FIELD
  step_info.def_readonly("epoch", &StepInfo::epoch)
      .def_readonly("rejections", &StepInfo::rejections, "inputs refused since the previous step")
      .def("__repr__", [](const StepInfo& s) {
        return "StepInfo(epoch=" + std::to_string(s.epoch) + ", step_index=" + std::to_string(s.step_index) +
               ", idle=" + (s.idle ? "True" : "False") + ", samples=" + std::to_string(s.sample_ids.size()) + ")";
      });
  dict_like(step_info);

  py::class_<PyDelivery>(m, "Delivery", "A step or an epoch end, owning its received frames.")
      .def_property_readonly("is_step", &PyDelivery::is_step)
      .def_property_readonly("step", [](const PyDelivery& d) { return d.get().step; }, "the step header (StepInfo)")
      .def_property_readonly("summary", [](const PyDelivery& d) { return SummaryDict(d); })
      .def("tensor_names", &PyDelivery::TensorNames)
      .def("array", &PyDelivery::Array, py::arg("name"),
           "numpy view over the received frame (no copy); bfloat16 comes as uint16")
      .def("arrays", &PyDelivery::Tensors)
      .def("wire_dtype", &PyDelivery::WireDType, py::arg("name"))
      .def("frame_address", &PyDelivery::FrameAddress, py::arg("name"))
      .def("frame_bytes", &PyDelivery::FrameBytes, py::arg("name"));

  py::class_<PyConsumer>(m, "Consumer", "Receives aligned steps from one daemon. Not thread-safe.")
      .def(py::init<const std::string&, int, const std::string&>(), py::arg("endpoint"),
           py::arg("receive_timeout_ms") = 120000, py::arg("data_plane") = "auto",
           "data_plane: 'auto' (the daemon's shared-memory step arena when it offers one and it maps; "
           "frames otherwise), 'shm' (an arena that cannot be mapped is an error) or 'zmq' (frames only)")
      .def_property_readonly("data_plane", &PyConsumer::DataPlaneInUse,
                             "'shm' once the step arena is mapped (steps are views of it), else 'zmq'")
      .def_property_readonly("arena_note", &PyConsumer::ArenaNote, "why an offered step arena is not used")
      .def("job_settings", &PyConsumer::JobSettingsDict, py::arg("timeout_ms") = py::none(),
           "The daemon's job settings from this session's acknowledgement (tokens_per_step, packed, "
           "trainer_data_plane, length_field, ignore_index), or None from a daemon older than them; waits "
           "for the acknowledgement at most timeout_ms (None: receive_timeout_ms; docs/protocol.md, "
           "\"Job settings\")")
      .def("step_arena_stats", &PyConsumer::StepArenaStatsDict,
           "the mapped step arena's counters (held_steps, returned_steps, ...), or None")
      .def("start_epoch", &PyConsumer::StartEpoch, py::arg("epoch"), py::arg("expected_producers") = 0,
           py::arg("first_round") = 0, py::arg("first_step") = 0,
           "first_round/first_step: resume a deterministic epoch at that round (docs/resume.md)")
      .def("next", &PyConsumer::Next,
           "The next step or epoch end; raises OdbTimeout after receive_timeout_ms, OdbError on a "
           "daemon failure.")
      .def_property_readonly("reconnects", &PyConsumer::Reconnects,
                             "connection blips survived: after each the session is announced again and "
                             "unanswered start_epoch requests are re-sent")
      .def("_start_epoch_lost_for_test", &PyConsumer::StartEpochLostForTest, py::arg("epoch"),
           py::arg("expected_producers") = 0,
           "test seam: records a start_epoch as sent without sending it (what a blip makes of it)")
      .def("_reconnect_for_test", &PyConsumer::ReconnectForTest,
           "test seam: drops the connection to the daemon and connects again (a blip)")
      .def("close", &PyConsumer::Close,
           "Closes the connection to the daemon now (the trainer session ends); any later call raises")
      .def("report_data_wait", &PyConsumer::ReportDataWait, py::arg("seconds"),
           "The trainer's wait for the step next() just returned; sent on the next credit, exported by the "
           "daemon as odb_trainer_data_wait_microseconds_total.");
}
