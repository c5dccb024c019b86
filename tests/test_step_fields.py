"""Every representation of a step takes its fields from the one list (tools/check_step_fields.py).

The broken trees are copies of this one with one edit each, as a newcomer
adding a step field might make it.
"""

from pathlib import Path

from tree_edit import ROOT, copy_paths, edit, load_tool


def load_checker():
    return load_tool("check_step_fields")


def copy_tree(tmp_path: Path) -> Path:
    checker = load_checker()
    return copy_paths(tmp_path, (checker.FIELDS_H, checker.PROTO, checker.BUILDER, checker.CONSUMER_H,
                                 checker.DECODER, checker.BINDINGS, checker.STUB, checker.STEP_PY, checker.PHASES_PY))


OWNER_RANKS_ENTRY = 'X(int32_t, owner_ranks, s.meta.owner_rank, true, "rank that received each sample")'
LAST_WIRE_FIELD = "  repeated bool has_seq = 39;\n"
LAST_STUB_LIST = "    def llm_audio_src_rank(self) -> List[int]: ...\n"
OWNER_RANKS_ATTR = "    owner_ranks: List[int] = field(default_factory=list)"


def add_foo_to_the_list(root: Path):
    edit(root, "proto/step_fields.h", OWNER_RANKS_ENTRY,
         OWNER_RANKS_ENTRY + ' \\\n  X(uint32_t, foo, s.meta.lengths.vision_patches, false, "a new per-sample field")')


def add_foo_to_the_wire(root: Path):
    edit(root, "proto/odb.proto", LAST_WIRE_FIELD, LAST_WIRE_FIELD + "  repeated uint32 foo = 40;\n")


def test_the_tree_takes_every_step_field_from_the_one_list():
    problems = load_checker().check(ROOT)
    assert problems == [], "\n".join(problems)


def test_a_new_per_sample_field_is_four_edits(tmp_path):
    """The list, the wire, the stub and odb.Step; the builder, the decoder, StepInfo and the bindings follow."""
    root = copy_tree(tmp_path)
    checker = load_checker()
    add_foo_to_the_list(root)
    problems = checker.check(root)
    assert "proto/odb.proto: Step has no field foo, which proto/step_fields.h lists: add " \
           "`repeated uint32 foo = <next number>;`" in problems, problems
    add_foo_to_the_wire(root)
    problems = checker.check(root)
    assert problems == ["client/python/odb/_odb_native.pyi: StepInfo has no property foo (proto/step_fields.h lists "
                        "it): add `@property def foo(self) -> List[int]: ...`"], problems
    edit(root, checker.STUB, LAST_STUB_LIST,
         LAST_STUB_LIST + "    @property\n    def foo(self) -> List[int]:\n        \"\"\"A new per-sample field.\"\"\"\n")
    assert checker.check(root) == []
    edit(root, checker.STEP_PY, OWNER_RANKS_ATTR, OWNER_RANKS_ATTR + "\n    foo: List[int] = field(default_factory=list)")
    assert checker.check(root) == []
    assert checker.main(["check_step_fields.py", str(root)]) == 0


def test_a_field_added_by_hand_past_the_list_is_caught_in_each_representation(tmp_path):
    root = copy_tree(tmp_path)
    checker = load_checker()
    add_foo_to_the_wire(root)
    edit(root, checker.CONSUMER_H, "  uint32_t epoch = 0;\n  std::vector<Rejection> rejections;\n",
         "  uint32_t epoch = 0;\n  std::vector<Rejection> rejections;\n  std::vector<uint32_t> foo;\n")
    edit(root, checker.DECODER, "  d.step.epoch = st.epoch();\n",
         "  d.step.epoch = st.epoch();\n  d.step.foo.assign(st.foo().begin(), st.foo().end());\n")
    edit(root, checker.BUILDER, "  const bool phases = options_.phase_plans;\n",
         "  const bool phases = options_.phase_plans;\n  step.add_foo(0);\n")
    edit(root, checker.STUB, LAST_STUB_LIST, LAST_STUB_LIST + "    @property\n    def foo(self) -> List[int]: ...\n")
    edit(root, checker.STEP_PY, OWNER_RANKS_ATTR, OWNER_RANKS_ATTR + "\n    foo: List[int] = field(default_factory=list)")
    problems = checker.check(root)
    assert any(p.startswith("proto/odb.proto:") and "Step.foo is not in the one list of step fields" in p
               for p in problems), problems
    assert any("StepInfo::foo is in no list of step fields" in p for p in problems), problems
    # Listing it afterwards does not make the hand copies right: each is named.
    add_foo_to_the_list(root)
    problems = checker.check(root)
    assert any(p.startswith("client/cpp/include/odb/consumer.h:") and "declares foo by hand" in p
               for p in problems), problems
    assert any(p.startswith("client/cpp/src/delivery_decoder.cc:") and "writes step field foo by hand" in p
               for p in problems), problems
    assert any(p.startswith("src/emit/step_builder.cc:") and "sets step field foo by hand" in p
               for p in problems), problems
    assert checker.main(["check_step_fields.py", str(root)]) == 1


def test_a_binding_by_hand_is_caught(tmp_path):
    root = copy_tree(tmp_path)
    checker = load_checker()
    edit(root, checker.BINDINGS, '  step_info.def_readonly("epoch", &StepInfo::epoch)\n',
         '  step_info.def_readonly("epoch", &StepInfo::epoch)\n'
         '      .def_readonly("lengths", &StepInfo::lengths)\n')
    problems = checker.check(root)
    assert any(p.startswith("client/python/bindings.cc:") and "binds step field lengths by hand" in p
               for p in problems), problems


def test_python_types_that_drift_from_the_list_are_caught(tmp_path):
    root = copy_tree(tmp_path)
    checker = load_checker()
    edit(root, checker.STUB, "    def seqs(self) -> List[Optional[int]]:", "    def seqs(self) -> List[int]:")
    edit(root, checker.STEP_PY, "    window_short: bool = False\n", "    window_short: bool = False\n    shiny: int = 0\n")
    edit(root, checker.STEP_PY, "    loss_tokens: int = 0\n", "    loss_tokens: float = 0\n")
    problems = checker.check(root)
    assert any("StepInfo.seqs returns List[int], the list says List[Optional[int]]" in p for p in problems), problems
    assert any("Step.shiny is not a step field" in p for p in problems), problems
    assert any("Step.loss_tokens is float, the list says int" in p for p in problems), problems


def test_a_wire_type_or_route_list_that_drifts_is_caught(tmp_path):
    root = copy_tree(tmp_path)
    checker = load_checker()
    edit(root, checker.PROTO, "  repeated int32 owner_ranks = 13;", "  repeated uint32 owner_ranks = 13;")
    edit(root, checker.PHASES_PY, '"llm_audio_src_rank")', ")")
    problems = checker.check(root)
    assert any("Step.owner_ranks is `repeated uint32`, the list says `repeated int32`" in p for p in problems), problems
    assert any("PHASE_FIELDS" in p and "differs from ODB_STEP_ROUTE_FIELDS" in p for p in problems), problems
