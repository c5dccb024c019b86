"""Writes the hand-made seeds of the arena_block, arena_register and step_arena fuzz targets
(fuzz/corpus/<target>/): run after ./scripts/build.sh (it uses .build/proto/odb_pb2.py).
The data region of the fixtures arena starts at 8192 (fuzz/arena_fixture.h)."""
import sys, struct, os
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, ".build/proto"))
import odb_pb2 as pb
D = 8192
def frames(fs):
    out = bytes([len(fs)])
    for i, f in enumerate(fs):
        if i + 1 < len(fs):
            out += struct.pack("<H", len(f))
        out += f
    return out
def sample(offset=D, length=128, arena_id=1, tensors=None, tokens=8, producer="p0"):
    m = pb.ProducerMessage(version=1)
    s = m.sample
    s.producer_id = producer; s.sample_id = 1; s.epoch = 0; s.tokens = tokens
    s.arena.arena_id = arena_id; s.arena.offset = offset; s.arena.length = length
    for name, toff, n in (tensors if tensors is not None else [("input_ids", offset, 8), ("labels", offset + 64, 8)]):
        t = s.tensors.add(); t.name = name; t.dtype = pb.INT64; t.shape.append(n); t.offset = toff; t.length = n * 8
    return m.SerializeToString()
out = os.path.join(ROOT, "fuzz/corpus")
def w(target, name, data):
    open(os.path.join(out, target, name), "wb").write(data)
w("arena_block", "valid_two_tensors", bytes([0]) + frames([sample()]))
w("arena_block", "held_twice_overlap", bytes([1]) + frames([sample()]))
w("arena_block", "other_producer", bytes([0x80]) + frames([sample()]))
w("arena_block", "misaligned_block", bytes([0]) + frames([sample(offset=D + 1, tensors=[("input_ids", D + 1, 8)])]))
w("arena_block", "tensor_outside_block", bytes([0]) + frames([sample(length=64)]))
w("arena_block", "unknown_arena", bytes([0]) + frames([sample(arena_id=2)]))
w("arena_block", "block_past_end", bytes([0]) + frames([sample(offset=D + (256 << 10) - 64, length=128, tensors=[("input_ids", D + (256 << 10) - 64, 8)])]))
w("arena_block", "before_data_region", bytes([0]) + frames([sample(offset=0, tensors=[("input_ids", 0, 8)])]))
w("arena_block", "arena_plus_frame", bytes([0]) + frames([sample(), b"\0" * 64]))
# arena_register: byte0 fd kind, byte1 patch flag, payload
def reg(producer="p0", version=1, gen=1, cap=256 << 10):
    r = pb.ArenaRegister(version=version, producer_id=producer, generation=gen, capacity_bytes=cap)
    return r.SerializeToString()
w("arena_register", "valid_patched", bytes([1, 1]) + reg())
w("arena_register", "no_fd", bytes([0, 1]) + reg())
w("arena_register", "unsealed_memfd", bytes([2, 1]) + reg())
w("arena_register", "pipe", bytes([3, 1]) + reg())
w("arena_register", "dev_null", bytes([4, 1]) + reg())
w("arena_register", "two_fds", bytes([5, 1]) + reg())
w("arena_register", "wrong_generation", bytes([1, 0]) + reg(gen=12345))
w("arena_register", "old_version", bytes([1, 1]) + reg(version=0))
w("arena_register", "empty_producer", bytes([1, 1]) + reg(producer=""))
w("arena_register", "long_producer", bytes([1, 1]) + reg(producer="p" * 5000))
w("arena_register", "garbage", bytes([1, 1]) + b"\xff\xfe\x00garbage")
# step_arena: byte0 even: request text; odd: frames of a daemon message
w("step_arena", "request_ok", b"\x00" + b"77")
w("step_arena", "request_zero", b"\x00" + b"0")
w("step_arena", "request_trailing", b"\x00" + b"77abc")
w("step_arena", "request_leading_zero", b"\x00" + b"077")
w("step_arena", "request_overflow", b"\x00" + b"18446744073709551616")
w("step_arena", "request_max", b"\x00" + b"18446744073709551615")
w("step_arena", "request_newline", b"\x00" + b"77\nfake log line")
w("step_arena", "request_negative", b"\x00" + b"-18446744073709551539")
def step(gen=77, offset=D, length=128, tensors=None, ids=(1,), lengths=(8,)):
    m = pb.DaemonMessage(version=1)
    st = m.step
    st.epoch = 0; st.step_index = 0; st.sample_ids.extend(ids); st.lengths.extend(lengths)
    st.real_tokens = 8; st.padded_tokens = 8; st.loss_weight = 1.0
    st.arena.generation = gen; st.arena.offset = offset; st.arena.length = length
    for name, toff, shape in (tensors if tensors is not None else [("input_ids", offset, [1, 8]), ("labels", offset + 64, [1, 8])]):
        t = st.tensors.add(); t.name = name; t.dtype = pb.INT64; t.shape.extend(shape); t.offset = toff
        n = 1
        for d in shape: n *= d
        t.length = n * 8
    return m.SerializeToString()
w("step_arena", "step_ok", b"\x01" + frames([step()]))
w("step_arena", "step_other_generation", b"\x01" + frames([step(gen=78)]))
w("step_arena", "step_tensor_outside_block", b"\x01" + frames([step(length=64)]))
w("step_arena", "step_block_past_end", b"\x01" + frames([step(offset=D + (256 << 10) - 64, tensors=[("input_ids", D + (256 << 10) - 64, [1, 8])])]))
w("step_arena", "step_misaligned", b"\x01" + frames([step(offset=D + 8, tensors=[("input_ids", D + 8, [1, 8])])]))
w("step_arena", "step_with_frame", b"\x01" + frames([step(), b"\0" * 64]))
w("step_arena", "step_in_header_region", b"\x01" + frames([step(offset=0, tensors=[("input_ids", 0, [1, 8])])]))
