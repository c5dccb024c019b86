"""Type stubs of `odb._odb_native`, the pybind11 extension (client/python/bindings.cc).

Kept in step with the bindings by tests/python/test_py_stubs.py: every name,
method and attribute here exists in the built module and the other way round,
and mypy --strict accepts a program using the API through these stubs.
"""
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, TypedDict, Union, overload

from _typeshed import ReadableBuffer
from numpy.typing import NDArray

# A tensor's bytes for Producer.send: any C-contiguous buffer (bytes, bytearray,
# memoryview, a numpy array, array.array) of exactly numel * dtype size bytes.
_Buffer = Union[ReadableBuffer, NDArray[Any]]
# (name, dtype code from DTYPES, shape, buffer)
_TensorInput = Tuple[str, int, Iterable[int], _Buffer]

DTYPES: Dict[str, int]
"""Wire dtype codes by name: uint8, int8, int16, int32, int64, float16, bfloat16, float32, float64, bool."""

class OdbError(Exception):
    """A daemon or client failure, with the C++ client's message."""

class OdbTimeout(OdbError):
    """A blocking call ran past its deadline (e.g. Consumer.next after receive_timeout_ms)."""

class Rejection:
    """An input the daemon refused, with the reason."""

    @property
    def code(self) -> str:
        """Error code name, e.g. "TOKENS_MISMATCH"."""
    @property
    def sample_id(self) -> Optional[int]:
        """The sample's id, or None when the input was not a readable sample."""
    @property
    def producer_id(self) -> str: ...
    @property
    def message(self) -> str:
        """What was wrong and what to do."""
    def __getitem__(self, key: str) -> Any: ...
    def get(self, key: str, default: Any = None) -> Any: ...

class StepInfo:
    """One step's header, as the daemon sent it (docs/protocol.md)."""

    @property
    def epoch(self) -> int: ...
    @property
    def step_index(self) -> int:
        """Identical on every rank."""
    @property
    def idle(self) -> bool:
        """No samples; weight 0."""
    @property
    def sample_ids(self) -> List[int]: ...
    @property
    def lengths(self) -> List[int]:
        """LLM tokens per sample, same order as sample_ids."""
    @property
    def owner_ranks(self) -> List[int]:
        """Rank that received each sample."""
    @property
    def seqs(self) -> List[Optional[int]]:
        """Each sample's position in its owner rank's list (its seq), None where it had none."""
    @property
    def real_tokens(self) -> int:
        """This rank's tokens in the step."""
    @property
    def padded_tokens(self) -> int:
        """What this rank computes on (the cost model)."""
    @property
    def global_real_tokens(self) -> int:
        """T_tok: all ranks' real tokens of this step."""
    @property
    def loss_weight(self) -> float:
        """W * loss_tokens / window_loss_tokens (per step without windows); 0 when idle."""
    @property
    def over_budget(self) -> bool:
        """A lone sample that fit no budget."""
    @property
    def samples_may_move(self) -> bool: ...
    @property
    def rejections(self) -> List[Rejection]:
        """Inputs refused since the previous step."""
    @property
    def rejections_are_errors(self) -> bool: ...
    @property
    def round(self) -> int:
        """The planning round of this step."""
    @property
    def round_first_step(self) -> int:
        """That round's first step index."""
    @property
    def round_steps(self) -> int:
        """That round's step count."""
    @property
    def deterministic(self) -> bool:
        """The daemon runs alignment.deterministic."""
    @property
    def loss_tokens(self) -> int:
        """This rank's loss-bearing tokens (labels not ignored; real_tokens if unknown)."""
    @property
    def window(self) -> int:
        """The accumulation window (optimizer step) of the epoch this step belongs to."""
    @property
    def window_steps(self) -> int:
        """Micro-steps in that window, the same on every rank."""
    @property
    def window_loss_tokens(self) -> int:
        """All ranks' loss tokens over the whole window."""
    @property
    def closes_window(self) -> bool:
        """The last micro-step of its window: run the optimizer after it."""
    @property
    def window_short(self) -> bool:
        """The epoch ended before the window reached its target."""
    @property
    def window_target(self) -> int:
        """The daemon's optimizer.tokens_per_step (0: every step is a window)."""
    @property
    def enc_sample_ids(self) -> List[int]: ...
    @property
    def enc_owner_ranks(self) -> List[int]: ...
    @property
    def enc_dest_rank(self) -> List[int]: ...
    @property
    def enc_dest_index(self) -> List[int]: ...
    @property
    def llm_src_rank(self) -> List[int]: ...
    @property
    def audio_sample_ids(self) -> List[int]: ...
    @property
    def audio_owner_ranks(self) -> List[int]: ...
    @property
    def audio_dest_rank(self) -> List[int]: ...
    @property
    def audio_dest_index(self) -> List[int]: ...
    @property
    def llm_audio_src_rank(self) -> List[int]: ...
    def __getitem__(self, key: str) -> Any: ...
    def get(self, key: str, default: Any = None) -> Any: ...

class _RejectionDict(TypedDict):
    code: str
    sample_id: Optional[int]
    producer_id: str
    message: str

class _EpochSummary(TypedDict):
    """Delivery.summary: the daemon's account of an epoch (a dict at run time)."""

    epoch: int
    received: int
    emitted: int
    rejected: int
    steps: int
    idle_steps: int
    real_tokens: int
    padded_tokens: int
    rejections: List[_RejectionDict]
    not_emitted_ids: List[int]
    rejections_are_errors: bool

class _JobSettings(TypedDict):
    """Consumer.job_settings(): the daemon's settings a trainer must agree with (a dict at run time)."""

    tokens_per_step: int
    packed: bool
    trainer_data_plane: str
    length_field: str
    ignore_index: Optional[int]

class Delivery:
    """A step or an epoch end, owning its received frames."""

    @property
    def is_step(self) -> bool: ...
    @property
    def step(self) -> StepInfo:
        """The step header (StepInfo)."""
    @property
    def summary(self) -> _EpochSummary: ...
    def tensor_names(self) -> List[str]: ...
    def array(self, name: str) -> NDArray[Any]:
        """Numpy view over the received frame (no copy); bfloat16 comes as uint16."""
    def arrays(self) -> Dict[str, NDArray[Any]]: ...
    def wire_dtype(self, name: str) -> int: ...
    def frame_address(self, name: str) -> int: ...
    def frame_bytes(self, name: str) -> int: ...

class Producer:
    """Sends samples to one daemon. Create it after fork."""

    def __init__(self, endpoint: str, producer_id: str, rank: int = -1, send_hwm: int = 64,
                 send_timeout_ms: int = 120000, data_plane: str = "auto", arena_bytes: int = 268435456,
                 shm_min_bytes: int = 16384) -> None:
        """data_plane: 'auto' (a shared-memory arena when the daemon is local, for samples of at least
        shm_min_bytes), 'shm' (always the arena; an error if unavailable) or 'zmq' (frames only);
        arena_bytes: the arena's capacity (docs/shm.md)."""
    def start_epoch(self, epoch: int) -> None: ...
    # In the extension `tensors` follows the two defaulted counts: pass all six
    # positionally, or the counts and `tensors` by keyword. seq: the sample's
    # position in this rank's list for the epoch (required by alignment.deterministic).
    @overload
    def send(self, sample_id: int, epoch: int, tokens: int, vision_patches: int, audio_frames: int,
             tensors: Sequence[_TensorInput], seq: Optional[int] = None, loss_tokens: Optional[int] = None) -> None: ...
    @overload
    def send(self, sample_id: int, epoch: int, tokens: int, *, vision_patches: int = 0, audio_frames: int = 0,
             tensors: Sequence[_TensorInput], seq: Optional[int] = None, loss_tokens: Optional[int] = None) -> None: ...
    def end_stream(self, epoch: int) -> None: ...
    def cancel(self) -> None:
        """Makes a blocked send/end_stream raise within ~100 ms (callable from another thread)."""
    def send_raw_frames(self, frames: Sequence[bytes]) -> None: ...
    def sent(self, epoch: int) -> int: ...
    @property
    def data_plane(self) -> str:
        """'shm' when an arena is registered with the daemon, else 'zmq'."""
    @property
    def arena_id(self) -> int:
        """The registered arena's id, 0 without one."""
    @property
    def arena_note(self) -> str:
        """Why there is no arena ('' with one)."""
    def arena_stats(self) -> Optional[Dict[str, int]]:
        """The arena's counters (capacity_bytes, allocations, returns, waits, outstanding_blocks,
        outstanding_bytes), or None without an arena."""

class Consumer:
    """Receives aligned steps from one daemon. Not thread-safe."""

    def __init__(self, endpoint: str, receive_timeout_ms: int = 120000, data_plane: str = "auto") -> None:
        """data_plane: 'auto' (the daemon's shared-memory step arena when it offers one and it maps; frames
        otherwise), 'shm' (an arena that cannot be mapped is an error) or 'zmq' (frames only)."""
    def start_epoch(self, epoch: int, expected_producers: int = 0, first_round: int = 0, first_step: int = 0) -> None:
        """first_round / first_step: resume a deterministic epoch at that round (docs/resume.md)."""
    def next(self) -> Delivery:
        """The next step or epoch end; raises OdbTimeout after receive_timeout_ms, OdbError on a daemon failure."""
    def close(self) -> None:
        """Closes the connection to the daemon now (the trainer session ends); any later call raises."""
    def report_data_wait(self, seconds: float) -> None:
        """The trainer's wait for the step next() just returned; sent on the next credit, exported by the daemon
        as odb_trainer_data_wait_microseconds_total."""
    @property
    def data_plane(self) -> str:
        """'shm' once the step arena is mapped (steps are views of it), else 'zmq'."""
    @property
    def arena_note(self) -> str:
        """Why an offered step arena is not used ('' otherwise)."""
    @property
    def reconnects(self) -> int:
        """Connection blips survived: after each the session is announced again and unanswered start_epoch
        requests are re-sent."""
    def _start_epoch_lost_for_test(self, epoch: int, expected_producers: int = 0) -> None: ...
    def _reconnect_for_test(self) -> None: ...
    def job_settings(self, timeout_ms: Optional[int] = None) -> Optional[_JobSettings]:
        """The daemon's job settings from this session's acknowledgement (tokens_per_step, packed,
        trainer_data_plane, length_field, ignore_index), or None from a daemon older than them; waits for the
        acknowledgement at most timeout_ms (None: receive_timeout_ms; docs/protocol.md, "Job settings")."""
    def step_arena_stats(self) -> Optional[Dict[str, int]]:
        """The mapped step arena's counters (generation, capacity_bytes, held_steps, returned_steps,
        return_failures), or None without one."""
