"""Bad inputs end in one clear error before anything compiles (docs/reliability.md,
"Bad inputs").

The generated campaign (`mipu_jax.testing.campaign`): a seeded sample of every
input kind in the default suite, the whole campaign under the `campaign`
marker (`python -m pytest -q -m campaign tests/test_bad_inputs.py`). Below it,
one regular test per defect the campaign found and that is now fixed, each
with the input that showed it, through the real readers (json, pyarrow,
safetensors, tokenizers, Jinja, orbax).
"""

import dataclasses
import json
import os
import shutil
import sys

import jax
import numpy as np
import pytest
from absl import flags
from ml_collections import config_flags
from safetensors.numpy import load_file
from safetensors.numpy import save_file

from mipu_jax import config as config_lib
from mipu_jax import math_eval
from mipu_jax import models
from mipu_jax import rl
from mipu_jax import testing
from mipu_jax import tokenizer as tokenizer_lib
from mipu_jax.rl import preflight
from mipu_jax.rl import resume
from mipu_jax.tasks import chat
from mipu_jax.tasks import math_data
from mipu_jax.testing import campaign
from mipu_jax.testing.campaign import configs as campaign_configs
from mipu_jax.testing.campaign import workdirs as campaign_workdirs
from mipu_jax.testing.campaign import world as world_lib

# Cases per kind in the default suite (about 20 s in all on 2 cores), and in
# the whole campaign (the table of docs/reliability.md).
SAMPLE = {"config": 150, "prompt data": 40, "evaluation sets": 40, "model directory": 40,
          "checkpoint / workdir": 20}
FULL = 1000


@pytest.fixture(scope="module")
def world(tmp_path_factory):
  return campaign.make_world(str(tmp_path_factory.mktemp("campaign")))


@pytest.fixture(scope="module")
def strategies(world):
  return campaign.strategies(world)


def _defects(outcomes):
  return [f"{o.what}: {o.detail}" for o in outcomes if o.verdict == campaign.DEFECT]


@pytest.mark.parametrize("kind", campaign.KINDS)
def test_a_sample_of_the_campaign_has_no_defect(strategies, kind):
  outcomes = campaign.run_kind(strategies[kind], SAMPLE[kind], seed=1)
  assert len(outcomes) == SAMPLE[kind]
  assert not _defects(outcomes)
  # The sample reaches both verdicts where its kind has valid inputs.
  assert any(o.verdict == campaign.REFUSED for o in outcomes)


@pytest.mark.campaign
@pytest.mark.parametrize("kind", campaign.KINDS)
def test_the_whole_campaign_has_no_defect(strategies, kind):
  outcomes = campaign.run_kind(strategies[kind], FULL, seed=0)
  print("\n" + campaign.core.table(outcomes))
  assert not _defects(outcomes)


def test_the_classifier_calls_a_raw_reader_error_a_defect(world):
  """A traceback from a reader's internals, a message without the file, a
  compile before the refusal and an accepted bad input are each a defect."""
  def raw():
    json.loads("{")
  def unnamed():
    math_eval.load_benchmark("math500", os.path.join(world.root, "nowhere.csv"))
  def compiled():
    jax.jit(lambda x: x + 1)(np.float32(2))   # a fresh program: one compile
    math_eval.canonical_name(world.ckpt)      # the library's ValueError, naming it
  verdicts = [campaign.core.run_case(campaign.Case("t", "t", run, names, must_refuse=True))
              for run, names in ((raw, ["x"]), (unnamed, ["elsewhere.csv"]),
                                 (compiled, [world.ckpt]), (lambda: None, ["x"]))]
  assert [v.verdict for v in verdicts] == [campaign.DEFECT] * 4
  assert "undocumented" in verdicts[0].detail and "names none" in verdicts[1].detail
  assert "compiles" in verdicts[2].detail and "should refuse" in verdicts[3].detail


def test_every_numeric_config_field_has_a_documented_range():
  numeric = {f.path for f in campaign_configs.FIELDS if f.kind in ("int", "float")}
  assert numeric - set(config_lib._ranges.RANGES) == campaign_configs.UNBOUNDED
  assert set(config_lib._ranges.RANGES) <= numeric


# --- configs ---------------------------------------------------------------


def _cd(**sections):
  cd = json.loads(json.dumps(config_lib.as_json(testing.tiny_run_config())))
  cd["loss"]["correction"] = {"preset": "token_tis"}
  for path, value in sections.items():
    *parents, leaf = path.split("__")
    node = cd
    for p in parents:
      node = node[p]
    node[leaf] = value
  return cd


def test_a_mistyped_config_value_is_refused_naming_its_field():
  """A seed of "abc" was accepted (hashed as a string), a string rate failed
  inside a comparison."""
  for path, value in (("seed", "abc"), ("optim__weight_decay", "0.1"),
                      ("data__group_size", 4.0), ("learner__shuffle", "yes"),
                      ("eval__tiers", "tier1")):
    with pytest.raises(ValueError, match=path.replace("__", ".")):
      config_lib.from_config_dict(_cd(**{path: value}))


def test_a_non_finite_config_number_is_refused():
  """A NaN KL or entropy coefficient (`nan < 0` is false) reached the loss."""
  for path in ("loss__kl_coef", "loss__entropy_coef", "optim__weight_decay",
               "logging__health__ess_min"):
    for value in (float("nan"), float("inf")):
      with pytest.raises(ValueError, match=f"{path.replace('__', '.')} must be a finite"):
        config_lib.from_config_dict(_cd(**{path: value}))


def test_a_config_number_outside_its_range_is_refused():
  """A negative seed failed in numpy at the first step; keep-last 0, β2 1.5 and
  a negative health threshold ran."""
  for path, value in (("seed", -1), ("checkpoint__keep", 0), ("optim__b2", 1.5),
                      ("logging__health__chi2_token_max", -1.0), ("mipu__seed", -3)):
    with pytest.raises(ValueError, match=f"{path.replace('__', '.')} must be in"):
      config_lib.from_config_dict(_cd(**{path: value}))


def _load(tmp_path, text, argv_extra=()):
  fn = tmp_path / "cfg.py"
  if text is not None:
    fn.write_text(text)
  fv = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, "", flag_values=fv, lock_config=True)
  argv = ["train", f"--config={fn}", *argv_extra]
  saved, sys.argv = sys.argv, argv
  sys.modules.pop("config_config", None)
  try:
    config_lib.load_flags(argv, flag_values=fv)
  finally:
    sys.argv = saved
  return fv.config


@pytest.mark.parametrize("text", ["def get_config(:\n  pass\n",
                                  "import no_such_module_xyz\n",
                                  "def get_config():\n  return None\n", None])
def test_a_config_file_that_does_not_load_is_one_flag_error_naming_it(tmp_path, text):
  """A syntax error or a missing import escaped from config_flags' internals as
  a traceback; a missing file or a get_config() without a return failed later."""
  with pytest.raises(flags.Error, match="cfg.py"):
    _load(tmp_path, text)


def test_a_correction_preset_of_none_is_refused():
  """It silently meant the default preset (token TIS) where "none" was meant."""
  with pytest.raises(ValueError, match="loss.correction.preset must be a string, got None"):
    config_lib.from_config_dict(_cd(loss__correction={"preset": None}))


def test_a_correction_error_names_its_section():
  with pytest.raises(ValueError, match=r"loss\.correction: IS lower bound 3\.0 > upper"):
    config_lib.from_config_dict(_cd(loss__correction={"preset": "token_tis",
                                                      "is_lower": 3.0}))


def test_a_batch_that_does_not_split_into_minibatches_names_the_fields():
  with pytest.raises(ValueError, match="does not split into learner.num_minibatches=3"):
    config_lib.from_config_dict(_cd(learner__num_minibatches=3))


def test_batch_rows_that_do_not_split_over_the_mesh_are_refused_before_building(tmp_path):
  """Refused by the learner at its first batch, after everything had compiled."""
  cfg = config_lib.from_config_dict(_cd(data__prompts_per_step=3, learner__mesh={
      "data": 8, "fsdp": 1, "tensor": 1}))
  with pytest.raises(ValueError, match="12 rows .* over the 8 data-parallel devices"):
    preflight.check(cfg, str(tmp_path / "run"))


def test_packed_rows_shorter_than_a_row_are_refused(tmp_path):
  cfg = config_lib.from_config_dict(_cd(learner__pack_length=8))
  with pytest.raises(ValueError, match="learner.pack_length=8 is shorter than one row"):
    preflight.check(cfg, str(tmp_path / "run"))


def _math(world, **data):
  cd = world.math_config()
  cd["data"].update(data)
  return cd


def test_max_new_tokens_beyond_the_checkpoints_context_is_refused(world, tmp_path):
  cd = _math(world)
  cd["sampling"]["max_new_tokens"] = 50_000
  with pytest.raises(ValueError, match="max_position_embeddings=40960"):
    preflight.check(config_lib.from_config_dict(cd), str(tmp_path / "run"))


def test_a_grader_module_that_does_not_exist_is_refused(world, tmp_path):
  """Its reward workers failed to start at the first step."""
  cd = _math(world, reward_grader="no_such_grader_pkg:grade")
  with pytest.raises(ValueError, match="data.reward_grader='no_such_grader_pkg:grade'"):
    preflight.check(config_lib.from_config_dict(cd), str(tmp_path / "run"))


def test_routing_replay_on_a_dense_checkpoint_is_refused_before_building(world, tmp_path):
  cd = _math(world)
  cd["moe"] = {"routing_replay": "rollout"}
  with pytest.raises(ValueError, match="moe.routing_replay='rollout' on a dense model"):
    preflight.check(config_lib.from_config_dict(cd), str(tmp_path / "run"))


def test_an_expert_axis_for_a_dense_checkpoint_is_refused_before_building(world, tmp_path):
  cd = _math(world)
  cd["learner"]["mesh"].update(expert=2, fsdp=1)
  with pytest.raises(ValueError, match="expert axis of size 2 but the model is dense"):
    preflight.check(config_lib.from_config_dict(cd), str(tmp_path / "run"))


# --- prompt data and evaluation sets ----------------------------------------


def _train_check(world, tmp_path, path):
  cfg = config_lib.from_config_dict(_math(world, train_file=str(path)))
  preflight.check(cfg, str(tmp_path / "run"))


def test_non_utf8_prompt_files_are_refused_naming_the_file(world, tmp_path):
  """A raw UnicodeDecodeError without the file's name."""
  for fmt in ("jsonl", "json"):
    path = tmp_path / f"bad.{fmt}"
    world_lib.write_rows(str(path), world_lib.math_rows(), fmt)
    path.write_bytes(b"\xff\xfe" + path.read_bytes())
    with pytest.raises(ValueError, match=f"bad.{fmt}.* is not UTF-8"):
      _train_check(world, tmp_path, path)


def test_truncated_json_and_parquet_files_are_refused_naming_the_file(world, tmp_path):
  """json's JSONDecodeError and pyarrow's ArrowInvalid / OSError came out raw."""
  for fmt, match in (("json", "is not valid JSON"), ("parquet", "not a readable parquet")):
    path = tmp_path / f"cut.{fmt}"
    world_lib.write_rows(str(path), world_lib.math_rows(), fmt)
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2])
    with pytest.raises(ValueError, match=f"cut.{fmt}.* {match}"):
      _train_check(world, tmp_path, path)


def test_an_empty_prompt_file_is_refused_naming_it(world, tmp_path):
  for fmt in ("jsonl", "json", "parquet"):
    path = tmp_path / f"empty.{fmt}"
    path.write_bytes(b"")
    with pytest.raises(ValueError, match=f"empty.{fmt}.* is empty"):
      _train_check(world, tmp_path, path)


def test_prompts_without_a_user_turn_and_answers_that_are_not_text_are_refused(world, tmp_path):
  """An empty message list trained on an empty prompt; an answer {}, [] or NaN
  was graded against the text "{}" / "[]" / "nan"."""
  rows = world_lib.dapo_rows()
  rows[3]["prompt"] = []
  path = world_lib.write_rows(str(tmp_path / "p.jsonl"), rows, "jsonl")
  with pytest.raises(ValueError, match="row 3 .* with a user turn"):
    math_data.load_problems(path)
  rows = world_lib.dapo_rows()
  rows[5]["reward_model"]["ground_truth"] = {}
  path = world_lib.write_rows(str(tmp_path / "a.jsonl"), rows, "jsonl")
  with pytest.raises(ValueError, match="row 5 .* should be a string or a finite number"):
    math_data.load_problems(path)
  rows = world_lib.math_rows()
  rows[2]["answer"] = float("nan")   # json writes NaN, and reads it back as a float
  path = world_lib.write_rows(str(tmp_path / "n.jsonl"), rows, "jsonl")
  with pytest.raises(ValueError, match="row 2 .* should be a string or a finite number"):
    math_data.load_problems(path)


def test_a_file_of_another_schema_is_refused_naming_the_file(world, tmp_path):
  rows = [{"text": r["problem"], "gold": r["answer"]} for r in world_lib.math_rows()]
  path = world_lib.write_rows(str(tmp_path / "other.jsonl"), rows, "jsonl")
  with pytest.raises(ValueError, match="other.jsonl.*cannot tell the schema"):
    _train_check(world, tmp_path, path)


def _bench_dir(world, tmp_path, name, rows=None, raw=None):
  d = tmp_path / "bench"
  shutil.copytree(world.benchmarks, d)
  for fn in os.listdir(d):
    if fn.startswith(name + "."):
      os.remove(d / fn)
  path = d / f"{name}.jsonl"
  if raw is not None:
    os.makedirs(path) if raw == "dir" else path.write_bytes(raw)
  else:
    world_lib.write_rows(str(path), rows, "jsonl")
  cd = world.math_config(benchmark_dir=str(d))
  return lambda: preflight.check(config_lib.from_config_dict(cd), str(tmp_path / "run"))


def test_a_benchmark_file_without_rows_is_refused(world, tmp_path):
  """Its score was a mean over no problems."""
  with pytest.raises(ValueError, match="math500: .* holds no problems"):
    _bench_dir(world, tmp_path, "math500", raw=b"\n")()


def test_benchmark_rows_with_empty_or_mistyped_questions_and_answers_are_refused(world, tmp_path):
  for i, (field, value) in enumerate((("question", "   "), ("question", True),
                                      ("answer", ""), ("answer", [])), start=1):
    rows = world_lib.benchmark_rows("amc23")
    rows[2][field] = value
    with pytest.raises(ValueError, match=f"amc23: row 2 .* {field!r} should be"):
      _bench_dir(world, tmp_path / str(i), "amc23", rows=rows)()


def test_a_benchmark_whose_problems_all_exceed_the_budget_is_refused(world, tmp_path):
  """It was kept with no problems (a NaN score)."""
  rows = world_lib.benchmark_rows("minerva_math")
  for r in rows:
    r["question"] = " ".join(["a very long problem statement"] * 60)
  with pytest.raises(ValueError, match="minerva_math .* none of its 4 problems fits"):
    _bench_dir(world, tmp_path, "minerva_math", rows=rows)()


def test_a_directory_named_as_a_benchmark_file_is_refused(world, tmp_path):
  """It was skipped as if absent."""
  with pytest.raises(ValueError, match="aime24: .*aime24.jsonl' is not a file"):
    _bench_dir(world, tmp_path, "aime24", raw="dir")()


# --- model directories -------------------------------------------------------


def _copy(world, tmp_path, sharded=False):
  d = str(tmp_path / "ckpt")
  shutil.copytree(world.sharded if sharded else world.ckpt, d)
  return d


def _rewrite_header(fn, edit):
  data = open(fn, "rb").read()
  n = int.from_bytes(data[:8], "little")
  header = json.loads(data[8:8 + n])
  edit(header)
  text = json.dumps(header).encode()
  text += b" " * (-len(text) % 8)
  with open(fn, "wb") as f:
    f.write(len(text).to_bytes(8, "little") + text + data[8 + n:])


def test_a_safetensors_header_that_lies_is_refused_before_any_tensor_is_read(world, tmp_path):
  """safetensors' Rust reader raised its own SafetensorError without the file's
  name, after the earlier tensors had been read and converted."""
  name = "model.layers.0.mlp.up_proj.weight"
  lies = {"shape": lambda h: h[name].update(shape=[h[name]["shape"][0] + 1,
                                                   h[name]["shape"][1]]),
          "dtype": lambda h: h[name].update(dtype="F16"),
          "offsets": lambda h: h[name].update(data_offsets=[h[name]["data_offsets"][0] + 8,
                                                            h[name]["data_offsets"][1] + 8])}
  for what, edit in lies.items():
    d = _copy(world, tmp_path / what)
    _rewrite_header(os.path.join(d, "model.safetensors"), edit)
    with pytest.raises(models.CheckpointError, match="model.safetensors is not a valid"):
      models.from_pretrained(d)


def test_a_truncated_tensor_file_is_refused_naming_it(world, tmp_path):
  d = _copy(world, tmp_path)
  fn = os.path.join(d, "model.safetensors")
  data = open(fn, "rb").read()
  open(fn, "wb").write(data[:-100])
  with pytest.raises(models.CheckpointError, match="a truncated file"):
    models.from_pretrained(d)


def test_integer_weights_of_the_right_size_are_refused(world, tmp_path):
  """I32 for F32 (same bytes) loaded as garbage weights."""
  d = _copy(world, tmp_path)
  _rewrite_header(os.path.join(d, "model.safetensors"),
                  lambda h: h["model.norm.weight"].update(dtype="I32"))
  with pytest.raises(models.CheckpointError, match="is I32; a Qwen3 checkpoint's weights"):
    models.from_pretrained(d)


def test_non_finite_weights_are_refused(world, tmp_path):
  d = _copy(world, tmp_path)
  fn = os.path.join(d, "model.safetensors")
  tensors = load_file(fn)
  tensors["model.norm.weight"] = tensors["model.norm.weight"].copy()
  tensors["model.norm.weight"][3] = np.nan
  save_file(tensors, fn)
  with pytest.raises(models.CheckpointError, match="model.norm.weight .* non-finite"):
    models.from_pretrained(d)


def test_an_index_mapping_a_tensor_to_the_wrong_shard_is_refused(world, tmp_path):
  d = _copy(world, tmp_path, sharded=True)
  fn = os.path.join(d, "model.safetensors.index.json")
  index = json.load(open(fn))
  shards = sorted(set(index["weight_map"].values()))
  name = next(n for n, s in index["weight_map"].items() if s != shards[0])
  index["weight_map"][name] = shards[0]
  json.dump(index, open(fn, "w"))
  with pytest.raises(models.CheckpointError, match="to shards that do not hold them"):
    models.from_pretrained(d)


def test_a_config_json_that_is_not_json_or_lacks_dims_is_refused_naming_it(world, tmp_path):
  """json's JSONDecodeError, a KeyError and a TypeError came out raw."""
  for i, edit in enumerate((lambda hf: "{", lambda hf: {k: v for k, v in hf.items()
                                                        if k != "hidden_size"},
                            lambda hf: {**hf, "num_hidden_layers": "1"})):
    d = _copy(world, tmp_path / str(i))
    fn = os.path.join(d, "config.json")
    new = edit(json.load(open(fn)))
    open(fn, "w").write(new if isinstance(new, str) else json.dumps(new))
    with pytest.raises(models.CheckpointError, match="config.json"):
      models.from_pretrained(d)


def test_a_moe_config_json_with_a_fractional_expert_count_is_refused_naming_it(world, tmp_path):
  """`num_experts` 64.5 was a TypeError from `range` in the tensor-name table."""
  d = str(tmp_path / "moe")
  shutil.copytree(world.moe, d)
  fn = os.path.join(d, "config.json")
  hf = json.load(open(fn))
  hf["num_experts"] = 64.5
  json.dump(hf, open(fn, "w"))
  with pytest.raises(models.CheckpointError, match="config.json: dimensions must be positive"):
    models.from_pretrained(d)


def test_config_dims_that_disagree_with_the_tensors_are_refused_from_the_headers(world, tmp_path):
  d = _copy(world, tmp_path)
  fn = os.path.join(d, "config.json")
  hf = json.load(open(fn))
  hf["intermediate_size"] += 1
  json.dump(hf, open(fn, "w"))
  with pytest.raises(models.CheckpointError, match="has shape .* for the config.json"):
    models.hf.check_pretrained(d)


def test_a_tokenizer_json_that_does_not_parse_is_refused_naming_it(world, tmp_path):
  """tokenizers raised a bare Exception ("EOF while parsing ...")."""
  d = _copy(world, tmp_path)
  fn = os.path.join(d, "tokenizer.json")
  open(fn, "wb").write(open(fn, "rb").read()[:500])
  with pytest.raises(ValueError, match="tokenizer.json is not a tokenizer"):
    tokenizer_lib.HFTokenizer.from_dir(d)


def test_tokenizer_side_files_that_are_not_json_are_refused_naming_them(world, tmp_path):
  for name in ("tokenizer_config.json", "generation_config.json"):
    d = _copy(world, tmp_path / name)
    open(os.path.join(d, name), "wb").write(b"\xff{")
    with pytest.raises(ValueError, match=f"{name} is not valid JSON"):
      tokenizer_lib.HFTokenizer.from_dir(d)


@pytest.mark.parametrize("template", [
    "{% for m in messages %}{{ m.__class__ }}{{ m['content'] }}{% endfor %}",
    "{{ ''.__class__.__mro__ }}{{ messages[0]['content'] }}",
    "{{ raise_exception.__globals__ }}{{ messages[0]['content'] }}",
])
def test_a_chat_template_reaching_outside_its_sandbox_is_refused(template):
  """Jinja's sandbox rendered the unsafe attribute as an empty string: the
  template was accepted and rendered the rest."""
  with pytest.raises(ValueError, match="outside its sandbox"):
    chat.render_chat(template, [{"role": "user", "content": "1 + 1?"}])


# --- checkpoints and workdirs --------------------------------------------------


def _saved_run(tmp_path, cfg, **kw):
  workdir = str(tmp_path / "run")
  campaign_workdirs._save(os.path.join(workdir, "checkpoints"), cfg, **kw)
  return workdir


class _Compiles:
  """Counts XLA compiles while it is open."""

  def __init__(self):
    self.n, self.on = 0, False
    jax.monitoring.register_event_duration_secs_listener(self._event)

  def _event(self, event, *args, **kwargs):
    if self.on and "backend_compile" in event:
      self.n += 1

  def __enter__(self):
    self.on = True
    return self

  def __exit__(self, *exc):
    self.on = False


def test_a_checkpoint_of_another_model_is_refused_and_kept(tmp_path):
  """The restore failed after the learner was compiled, moved the step aside
  as unreadable and stopped with "No checkpoint ... could be restored"."""
  cfg = testing.tiny_run_config(2)
  workdir = _saved_run(tmp_path, cfg, params_vocab=97)
  with _Compiles() as c, pytest.raises(ValueError, match="holds another model.*embed"):
    rl.train(cfg, workdir)
  assert c.n == 0
  assert os.listdir(os.path.join(workdir, "checkpoints")) == ["1"]
  assert not os.path.exists(os.path.join(workdir, "checkpoints.unreadable"))


def test_another_runs_checkpoint_is_refused_before_anything_compiles(tmp_path):
  """The config was compared after the learner and the sampler had been built
  and the state restored."""
  cfg = testing.tiny_run_config(2)
  workdir = _saved_run(tmp_path, dataclasses.replace(cfg, seed=7))
  with _Compiles() as c, pytest.raises(resume.ConfigChangedError, match="seed: 7"):
    rl.train(cfg, workdir)
  assert c.n == 0


def test_another_runs_config_json_without_a_checkpoint_is_refused(tmp_path):
  """A fresh start overwrote it with this run's config."""
  cfg = testing.tiny_run_config(2)
  other = config_lib.as_json(dataclasses.replace(cfg, seed=5))
  workdir = tmp_path / "run"
  workdir.mkdir()
  (workdir / "config.json").write_text(json.dumps(other))
  with pytest.raises(resume.ConfigChangedError, match="seed: 5"):
    rl.train(cfg, str(workdir))
  assert json.loads((workdir / "config.json").read_text()) == other


def test_checkpoint_metadata_of_another_version_is_refused_naming_it(tmp_path):
  """A KeyError ('config') after the restore."""
  cfg = testing.tiny_run_config(2)
  workdir = _saved_run(tmp_path, cfg)
  fn = os.path.join(workdir, "checkpoints", "1", "metadata", "metadata")
  meta = json.load(open(fn))
  del meta["config"]
  meta["library_version"] = "0.0.9"
  json.dump(meta, open(fn, "w"))
  with pytest.raises(ValueError, match="another version of mipu_jax \\(0.0.9"):
    preflight.check(cfg, workdir)


def test_a_workdir_that_is_a_file_is_refused(tmp_path):
  """os.makedirs raised FileExistsError."""
  path = tmp_path / "run"
  path.write_text("")
  with pytest.raises(ValueError, match="is a file, not a directory"):
    rl.train(testing.tiny_run_config(2), str(path))
