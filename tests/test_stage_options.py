"""Each I/O stage owns its config knobs (tools/check_stage_options.py, docs/config.md).

The broken trees are copies of this one with one edit each, as a newcomer
adding a knob might make it.
"""

import shutil
from pathlib import Path

from tree_edit import ROOT, copy_paths, edit, load_tool

# What the checker reads, copied into each broken tree.
COPIED = ["src/daemon", "src/ingest", "src/emit", "src/exchange", "configs/odbd.yaml", "docs/config.md",
          "src/align/planner.h", "src/align/gloo_peer_group.h", "src/balance/global_planner.h"]


def load_checker():
    return load_tool("check_stage_options")


def copy_tree(tmp_path: Path) -> Path:
    return copy_paths(tmp_path, COPIED, ignore=shutil.ignore_patterns("*_test.cc", "BUILD"))


HWM_FIELD = "  int hwm = 1000;  // ingest_hwm: the ZMQ receive high-water mark of each ingest socket\n"
HWM_ROW = '  add(Field("ingest_hwm", kRank, ODB_FIELD(ingest.hwm),\n'
HWM_YAML_LINE = "ingest_hwm: 1000"
INGEST_ROW_KEYS = "`ingest_endpoints`, `ingest_hwm`,"


def add_linger_knob_in_yaml(root: Path):
    edit(root, "configs/odbd.yaml", HWM_YAML_LINE, "ingest_linger_ms: 0  # a new knob\n" + HWM_YAML_LINE)


def test_the_tree_keeps_each_knob_with_its_stage():
    problems = load_checker().check(ROOT)
    assert problems == [], "\n".join(problems)


def test_a_new_one_stage_knob_takes_its_options_one_table_row_and_the_docs_only(tmp_path):
    root = copy_tree(tmp_path)
    edit(root, "src/ingest/ingest_options.h", HWM_FIELD,
         HWM_FIELD + "  uint32_t linger_ms = 0;  // ingest_linger_ms: a new knob\n")
    edit(root, "src/daemon/settings.cc", HWM_ROW,
         '  add(Field("ingest_linger_ms", kRank, ODB_FIELD(ingest.linger_ms), "a new knob"));\n' + HWM_ROW)
    checker = load_checker()
    # Without its docs: not in configs/odbd.yaml, not in docs/config.md's table.
    problems = checker.check(root)
    assert any("names config key 'ingest_linger_ms', which configs/odbd.yaml does not list" in p
               for p in problems), problems
    assert any("the row of `ingest::IngestOptions` does not list `ingest_linger_ms`" in p for p in problems), problems
    add_linger_knob_in_yaml(root)
    edit(root, "docs/config.md", INGEST_ROW_KEYS, INGEST_ROW_KEYS + " `ingest_linger_ms`,")
    assert checker.check(root) == []  # config.h and stage_options.cc untouched


def test_a_one_stage_knob_kept_as_a_flat_field_and_copied_in_is_caught(tmp_path):
    root = copy_tree(tmp_path)
    edit(root, "src/daemon/config.h", '  std::string run_dir = "/tmp/odb";\n',
         '  std::string run_dir = "/tmp/odb";\n  uint32_t ingest_linger_ms = 0;\n')
    edit(root, "src/daemon/settings.cc", HWM_ROW,
         '  add(Field("ingest_linger_ms", kRank, ODB_FIELD(ingest_linger_ms), "a new knob"));\n' + HWM_ROW)
    edit(root, "src/ingest/ingest_options.h", HWM_FIELD,
         HWM_FIELD + "  uint32_t linger_ms = 0;  // derived (ingest_linger_ms)\n")
    edit(root, "src/daemon/stage_options.cc", "  o.window = c.window;\n",
         "  o.window = c.window;\n  o.linger_ms = c.ingest_linger_ms;\n")
    add_linger_knob_in_yaml(root)
    checker = load_checker()
    problems = checker.check(root)
    assert any(p.startswith("DaemonConfig::ingest_linger_ms feeds IngestOptions only") for p in problems), problems
    assert checker.main(["check_stage_options.py", str(root)]) == 1


def test_a_knob_of_its_own_copied_in_from_a_flat_field_is_caught(tmp_path):
    root = copy_tree(tmp_path)
    edit(root, "src/daemon/config.h", '  std::string run_dir = "/tmp/odb";\n',
         '  std::string run_dir = "/tmp/odb";\n  uint32_t ingest_linger_ms = 0;\n')
    edit(root, "src/daemon/settings.cc", HWM_ROW,
         '  add(Field("ingest_linger_ms", kRank, ODB_FIELD(ingest_linger_ms), "a new knob"));\n' + HWM_ROW)
    edit(root, "src/ingest/ingest_options.h", HWM_FIELD,
         HWM_FIELD + "  uint32_t linger_ms = 0;  // ingest_linger_ms: a new knob\n")
    edit(root, "src/daemon/stage_options.cc", "  o.window = c.window;\n",
         "  o.window = c.window;\n  o.linger_ms = c.ingest_linger_ms;\n")
    edit(root, "docs/config.md", INGEST_ROW_KEYS, INGEST_ROW_KEYS + " `ingest_linger_ms`,")
    add_linger_knob_in_yaml(root)
    problems = load_checker().check(root)
    assert any("assigns IngestOptions::linger_ms, a knob of its own" in p for p in problems), problems
    assert any("does not read 'ingest_linger_ms' straight into c.ingest.linger_ms" in p for p in problems), problems


def test_a_field_that_says_neither_parsed_nor_derived_is_caught(tmp_path):
    root = copy_tree(tmp_path)
    edit(root, "src/emit/step_builder_options.h", "  bool non_join = false;\n",
         "  bool non_join = false;\n  bool fancy = false;\n")
    problems = load_checker().check(root)
    assert any("StepBuilderOptions::fancy says neither" in p for p in problems), problems


def test_a_stage_default_repeated_in_daemon_config_is_caught(tmp_path):
    root = copy_tree(tmp_path)
    edit(root, "src/daemon/config.h", "  emit::TrainerChannelOptions trainer;\n",
         "  emit::TrainerChannelOptions trainer{.outstanding_depth = 8};\n")
    problems = load_checker().check(root)
    assert any("DaemonConfig::trainer is initialized" in p for p in problems), problems


def test_a_derived_field_left_unfilled_or_read_from_the_member_is_caught(tmp_path):
    root = copy_tree(tmp_path)
    edit(root, "src/daemon/stage_options.cc", "  o.window = c.window;\n", "")
    edit(root, "src/daemon/daemon.cc", "metrics_server_(metrics_, config_.rank)",
         "metrics_server_(metrics_, config_.trainer.rank)")
    problems = load_checker().check(root)
    assert any("IngestOptions::window is derived" in p and "(found 0)" in p for p in problems), problems
    assert any("daemon.cc reads trainer.rank of DaemonConfig, which is derived" in p for p in problems), problems


def test_a_docs_table_that_drifts_from_the_structs_is_caught(tmp_path):
    root = copy_tree(tmp_path)
    edit(root, "docs/config.md", INGEST_ROW_KEYS, "`ingest_endpoints`,")
    edit(root, "docs/config.md", "| `collate.encoder_fields`, `bad_input`,",
         "| `collate.encoder_fields`, `bad_input`, `ingest_hwm`,")
    problems = load_checker().check(root)
    assert any("the row of `ingest::IngestOptions` does not list `ingest_hwm`" in p for p in problems), problems
    assert any("the row of `emit::StepBuilderOptions` lists `ingest_hwm`, which StepBuilderOptions does not parse"
               in p for p in problems), problems


def test_a_knob_parsed_into_a_flat_field_instead_of_its_member_is_caught(tmp_path):
    root = copy_tree(tmp_path)
    edit(root, "src/daemon/settings.cc", HWM_ROW, '  add(Field("ingest_hwm", kRank, ODB_FIELD(ingest_hwm),\n')
    problems = load_checker().check(root)
    assert any("does not read 'ingest_hwm' straight into c.ingest.hwm" in p for p in problems), problems


def test_stage_options_declared_outside_an_options_header_are_caught(tmp_path):
    root = copy_tree(tmp_path)
    (root / "src/exchange/exchange_options.h").rename(root / "src/exchange/payload_exchange_config.h")
    problems = load_checker().check(root)
    assert "src/exchange/ has no *_options.h: a stage declares the options it reads there, beside it" in problems
    assert any("builds ExchangeOptions, which no src/<stage>/*_options.h declares" in p for p in problems), problems
    assert any("DaemonConfig holds ExchangeOptions, which no" in p for p in problems), problems


def test_a_setting_whose_default_is_written_twice_is_caught(tmp_path):
    """The daemon copies alignment.* into the planner's and the peer group's own option structs: their defaults
    must be the daemon's by construction, not two literals that can drift apart (window 256 vs 512 once)."""
    root = copy_tree(tmp_path)
    assert load_checker().check(root) == []
    edit(root, "src/daemon/config.h", "  uint32_t window = align::PlannerConfig{}.window;\n",
         "  uint32_t window = 512;\n")
    edit(root, "src/daemon/config.h",
         "  uint32_t connect_timeout_ms = static_cast<uint32_t>(align::GlooPeerGroupOptions{}.connect_timeout.count());\n",
         "  uint32_t connect_timeout_ms = 30000;\n")
    problems = load_checker().check(root)
    assert any(p.startswith("src/daemon/config.h: DaemonConfig::window has its own default (512)")
               and "PlannerConfig::window" in p for p in problems), problems
    assert any("DaemonConfig::connect_timeout_ms has its own default (30000)" in p
               and "GlooPeerGroupOptions::connect_timeout" in p for p in problems), problems
