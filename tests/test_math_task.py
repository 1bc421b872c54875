"""The math task: chat templates as transformers renders them, the checkpoint's tokenizer,
prompt files and their order, the reward pool, and a tiny end-to-end run with export."""

import json
import logging
import os
import pathlib
import shutil

import chex
import jax
import numpy as np
import pytest
from flax import nnx

from mipu_jax import config as config_lib
from mipu_jax import math_eval
from mipu_jax import models
from mipu_jax import rl
from mipu_jax import tasks
from mipu_jax.rl import build
from mipu_jax.rl import evaluation as rl_evaluation
from mipu_jax.tasks import chat
from mipu_jax.tasks import math_data
from mipu_jax.tasks import math_task
from mipu_jax.testing import checkpoint as tiny
from mipu_jax.tokenizer import completion_text
from mipu_jax.tokenizer import HFTokenizer
from studies.configs import math as math_config

FIXTURES = pathlib.Path(__file__).parent / "fixtures"
DAPO = str(FIXTURES / "train" / "dapo_math.jsonl")
MATH = str(FIXTURES / "train" / "math_train.jsonl")
EVALS = str(FIXTURES / "benchmarks")


@pytest.fixture(scope="module")
def ckpt(tiny_ckpt):
  return tiny_ckpt


# A template using what real ones use: a default system turn, namespace,
# loop controls, tojson, raise_exception, and the special tokens.
_FANCY = (
    "{{ bos_token or '' }}{%- if messages[0]['role'] != 'system' %}"
    "{{- '<|im_start|>system\\nYou are helpful.<|im_end|>\\n' }}{%- endif %}"
    "{%- set ns = namespace(n=0) %}"
    "{%- for m in messages %}{%- if m['role'] == 'tool' %}{% continue %}{% endif %}"
    "{%- set ns.n = ns.n + 1 %}"
    "{%- if m['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('bad role ' + m['role']) }}{% endif %}"
    "{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}{{- '<!--' + ({'turns': ns.n, 'eos': eos_token} | tojson) + '-->' }}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")


@pytest.mark.parametrize("template", [tiny.CHATML_TEMPLATE, _FANCY], ids=["chatml", "fancy"])
def test_chat_template_renders_as_transformers(ckpt, template):
  import transformers  # pylint: disable=g-import-not-at-top
  ref = transformers.AutoTokenizer.from_pretrained(ckpt)
  tok = HFTokenizer.from_dir(ckpt)
  conversations = [
      [{"role": "user", "content": "What is $2+2$? <é> \"quoted\""}],
      [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "x"},
       {"role": "tool", "content": "ignored"}, {"role": "user", "content": "y", "name": None}],
  ]
  for messages in conversations:
    want = ref.apply_chat_template(messages, chat_template=template, tokenize=False,
                                   add_generation_prompt=True)
    assert chat.render_chat(template, messages, tok.special_tokens) == want
  with pytest.raises(ValueError, match="bad role"):
    chat.render_chat(_FANCY, [{"role": "robot", "content": "x"}], tok.special_tokens)
  with pytest.raises(ValueError, match="role, content"):
    chat.render_chat(template, [{"content": "no role"}])


def test_raw_template_for_base_models():
  assert chat.render_raw("Q: {question}\nA:", "1+1?") == "Q: 1+1?\nA:"
  with pytest.raises(ValueError, match="question"):
    chat.render_raw("no field", "x")
  with pytest.raises(ValueError, match="other than"):
    chat.render_raw("{question} {other}", "x")


def test_checkpoint_tokenizer_has_no_bos_and_every_stop_id(ckpt):
  tok = HFTokenizer.from_dir(ckpt)
  gen = json.load(open(os.path.join(ckpt, "generation_config.json")))
  model_cfg = json.load(open(os.path.join(ckpt, "config.json")))
  assert model_cfg["bos_token_id"] is not None  # as Qwen3's config.json ...
  assert tok.bos_id is None  # ... but tokenizer_config says bos_token: null
  assert set(tok.stop_ids) == set(gen["eos_token_id"]) and tok.stop_ids[0] == tok.eos_id
  # A completion ends at the first of any stop id.
  text_ids = tok.encode("x = 6")
  for stop in tok.stop_ids:
    ids = text_ids + [stop] + tok.encode("junk")
    assert completion_text(tok, ids) == "x = 6"


def _cfg(ckpt, arg="", **data):
  config = math_config.get_config(f"ckpt={ckpt},train={DAPO},eval={EVALS},quick" + arg)
  for k, v in data.items():
    config.data[k] = v
  return config_lib.from_config_dict(config)


def test_a_checkpoint_with_another_tokenizer_is_refused(ckpt, tmp_path):
  arith = config_lib.default_config()
  arith.model.init_from = ckpt  # a Qwen3 dir with its own tokenizer.json
  with pytest.raises(ValueError, match="character tokenizer"):
    build.make_task(config_lib.from_config_dict(arith))
  base_policy = os.path.join(os.path.dirname(tasks.__file__), "assets", "base_policy")
  cfg = _cfg(ckpt)
  with pytest.raises(ValueError, match="no tokenizer.json"):
    build.make_task(cfg.__class__(**{**cfg.__dict__, "model": config_lib.ModelConfig(
        init_from=base_policy)}))
  # A checkpoint whose vocabulary cannot hold the tokenizer's ids.
  small = tmp_path / "small_vocab"
  tiny.write_tiny_qwen3(str(small), vocab_size=128)
  with pytest.raises(ValueError, match="does not fit the task tokenizer"):
    build.make_policy(config_lib.ModelConfig(init_from=str(small)),
                      HFTokenizer.from_dir(str(small)))


def test_a_preset_unlike_the_checkpoint_is_warned_about(ckpt, caplog):
  tok = HFTokenizer.from_dir(ckpt)
  with caplog.at_level(logging.INFO, logger="mipu_jax.rl.build"):
    model = build.make_policy(config_lib.ModelConfig(init_from=ckpt, preset="qwen3_0p6b"),
                              tok)
  assert model.config.num_layers == 2  # the checkpoint's architecture runs
  (warning,) = [r for r in caplog.records if r.levelno == logging.WARNING]
  assert "model.preset='qwen3_0p6b'" in warning.message
  for diff in ("num_layers 28 vs 2", "hidden_size 1024 vs 64", "num_heads 16 vs 4",
               "num_kv_heads 8 vs 2", f"vocab_size 151936 vs {model.config.vocab_size}"):
    assert diff in warning.message
  # The default preset, left as is by a config that loads a checkpoint: a note.
  caplog.clear()
  with caplog.at_level(logging.INFO, logger="mipu_jax.rl.build"):
    build.make_policy(config_lib.ModelConfig(init_from=ckpt), tok)
  assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
  assert any("vocab_size 256 vs" in r.message for r in caplog.records)


def test_prompt_files_in_both_schemas_and_clear_errors(tmp_path):
  dapo = math_data.load_problems(DAPO)
  assert len(dapo) == 12 and dapo[0].messages and dapo[0].answer == "15"
  assert dapo[0].id == "fixture-0000" and "What is $7 + 8$?" in dapo[0].prompt
  math = math_data.load_problems(MATH, schema="math")
  assert math[0].question.startswith("What is $\\frac{1}{2}") and math[0].answer == "\\frac{5}{6}"
  assert math[1].answer == "3"  # from the boxed answer of `solution`
  custom = tmp_path / "custom.jsonl"
  custom.write_text(json.dumps({"q": "1+1?", "meta": {"gold": "2"}}) + "\n")
  (p,) = math_data.load_problems(str(custom), schema="math", prompt_key="q",
                                 answer_key="meta.gold")
  assert (p.question, p.answer, p.id) == ("1+1?", "2", "0")
  with pytest.raises(ValueError, match="no answer field"):
    math_data.load_problems(str(custom), schema="math", prompt_key="q")
  with pytest.raises(ValueError, match="cannot tell the schema"):
    math_data.load_problems(str(custom))
  with pytest.raises(ValueError, match="unknown data.schema"):
    math_data.load_problems(DAPO, schema="gsm8k")
  with pytest.raises(FileNotFoundError):
    math_data.load_problems(str(tmp_path / "missing.jsonl"))


def test_long_prompts_are_dropped_and_counted(ckpt):
  task = build.make_task(_cfg(ckpt, max_prompt_tokens=150))
  lengths = [len(task.encode(p)) for p in math_data.load_problems(DAPO)]
  assert task.dropped_long == sum(n > 150 for n in lengths) > 0
  assert all(len(task.encode(p)) <= 150 for p in task.train + task.probe)
  assert task.data_stats() == {"data/dropped_long": task.dropped_long,
                               "data/eval_dropped_long": 0}


def test_missing_benchmarks_are_skipped_and_long_problems_left_out(ckpt, tmp_path, caplog):
  """Two of the five benchmark files: only those are evaluated, the three
  missing ones are named; a problem over the prompt budget is left out and counted."""
  shutil.copy(os.path.join(EVALS, "aime24.jsonl"), tmp_path)
  rows = pathlib.Path(EVALS, "math500.jsonl").read_text().splitlines()
  long = {"problem": "Add these up: " + " + ".join(["1"] * 200), "answer": "200",
          "unique_id": "test/long.json"}
  (tmp_path / "math500.jsonl").write_text("\n".join(rows + [json.dumps(long)]) + "\n")
  with caplog.at_level(logging.WARNING, logger="mipu_jax.tasks.math_task"):
    found = math_task.find_benchmarks(str(tmp_path), math_eval.BENCHMARKS)
    assert list(found) == ["math500", "aime24"]
    task = tasks.MathTask(HFTokenizer.from_dir(ckpt), DAPO, max_prompt_tokens=150,
                          num_probe=2, benchmark_dir=str(tmp_path))
  assert task.eval_names == ("math500", "aime24")
  sets = task.eval_sets(seed=0)
  assert [len(sets["math500"]), len(sets["aime24"])] == [len(rows), 3]
  assert task.data_stats()["data/eval_dropped_long"] == 1
  messages = [r.getMessage() for r in caplog.records]
  for missing in ("amc23", "minerva_math", "olympiadbench"):
    assert any(m.startswith(f"Benchmark {missing}: no ") and "skipped" in m
               for m in messages), missing
  assert any(m.startswith("Benchmark math500: left out 1 of 5") for m in messages)
  with pytest.raises(ValueError, match="holds none of the benchmark files"):
    math_task.find_benchmarks(str(tmp_path), ["amc23"])


def test_prompt_ids_are_not_mixed_up_when_an_object_id_is_reused(ckpt):
  task = build.make_task(_cfg(ckpt))
  for i in range(20):  # CPython reuses a freed object's id at once
    problem = math_data.MathProblem(id=str(i), answer="2", question=f"What is {i} + {i}?")
    assert task.encode(problem) == tuple(task.tokenizer.encode(task.render(problem)))
    del problem


def test_data_order_is_a_pure_function_of_seed_and_step(ckpt):
  cfg = _cfg(ckpt)
  a, b = build.make_task(cfg), build.make_task(cfg)
  n = 3
  steps = range(1, 8)
  first = [[p.id for p in a.sample(n, seed=0, step=k)] for k in steps]
  # Any order of calls (a resumed run starts mid-stream) gives the same prompts.
  assert [[p.id for p in b.sample(n, seed=0, step=k)] for k in reversed(steps)][::-1] == first
  # Each epoch visits every training prompt once (10 train prompts, 3 per step).
  flat = [i for ids in first for i in ids]
  assert sorted(flat[:10]) == sorted(p.id for p in a.train)
  assert (a.epoch(4, n), a.epoch(5, n)) == (0, 1)  # positions 9 and 12
  # Extra dynamic-sampling rounds come from their own stream.
  assert [p.id for p in a.sample(n, seed=0, step=1, round=1)] != first[0]
  assert {p.id for p in a.sample(4, seed=0, step=3, split="probe")} <= {p.id for p in a.probe}


def test_a_workers_first_call_is_start_up_not_the_first_items_time():
  # The grader's first call in a process (math-verify loading its parsers) is
  # made before the worker says it is ready, so a 1 s limit does not cut it.
  pool = tasks.RewardPool(num_workers=1, timeout_s=1.0,
                          grade="mipu_jax.testing.graders:slow_first")
  assert pool.grade(["\\boxed{4}", "\\boxed{5}"], ["4", "4"]).tolist() == [True, False]
  assert (pool.timeouts, pool.errors) == (0, 0)
  pool.close()
  # A start-up past its own limit is an error that says what start-up covers.
  slow = tasks.RewardPool(num_workers=1, startup_timeout_s=0.5,
                          grade="mipu_jax.testing.graders:slow_first")
  with pytest.raises(RuntimeError, match=r"did not start \(import the grader and grade one "
                     r"sample pair\) within 0.5 s"):
    slow.grade(["\\boxed{4}"], ["4"])


def test_reward_pool_time_limit_errors_and_crashes(ckpt):
  pool = tasks.RewardPool(num_workers=2, timeout_s=2.0,
                          grade="mipu_jax.testing.graders:stubborn")
  golds = ["4", "4", "4", "4", "4", "4"]
  completions = ["\\boxed{4}", "HANG \\boxed{4}", "Answer: 4", "RAISE", "EXIT",
                 "\\boxed{5}"]
  right = pool.grade(completions, golds)
  np.testing.assert_array_equal(right, [True, False, True, False, False, False])
  assert (pool.timeouts, pool.errors) == (1, 2)
  assert pool.grade(["\\boxed{4}"], ["4"]).tolist() == [True]  # workers replaced
  pool.close()
  # Through the task: counted in the step's metrics, scored as wrong.
  task = build.make_task(_cfg(ckpt, reward_grader="mipu_jax.testing.graders:stubborn",
                              reward_timeout_s=2.0, reward_wrong=-1.0,
                              truncated="filter"))
  problems = task.train[:3]
  rewards, keep, stats = task.reward(problems, ["HANG", f"\\boxed{{{problems[1].answer}}}",
                                                "x"], [False, False, True])
  np.testing.assert_array_equal(rewards, [-1.0, 1.0, -1.0])
  np.testing.assert_array_equal(keep, [True, True, False])
  assert stats["reward/timeouts"] == 1 and stats["reward/truncated_filtered"] == 1


def test_math_config_needs_its_inputs(ckpt):
  with pytest.raises(ValueError, match="needs ckpt=DIR"):
    math_config.get_config(f"train={DAPO}")
  with pytest.raises(ValueError, match="not a file"):
    config_lib.from_config_dict(math_config.get_config(f"ckpt={ckpt},train=/nope.jsonl"))
  bad = math_config.get_config(f"ckpt={ckpt},train={DAPO}")
  bad.data.truncated = "drop"
  with pytest.raises(ValueError, match="data.truncated"):
    config_lib.from_config_dict(bad)


@pytest.mark.extended
@pytest.mark.long
def test_two_steps_with_eval_checkpoint_resume_and_export(ckpt, tmp_path, monkeypatch):
  """2 RL steps of the tiny checkpoint on the DAPO fixtures: evaluation on the
  five benchmark fixtures, a checkpoint after step 1, a resumed second step,
  and Hugging Face exports (final, best) that transformers loads, with matching
  logits."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top

  # Two steps at lr 1e-6 leave the evaluation's samples unchanged: step 0's
  # score is lowered so that step 1's policy is, deterministically, the best.
  real_evaluate, calls = rl_evaluation.evaluate, []

  def evaluate(*args, **kwargs):
    metrics = real_evaluate(*args, **kwargs)
    calls.append(metrics["eval/avg"])
    if len(calls) == 1:
      metrics["eval/avg"] -= 1.0
    return metrics

  monkeypatch.setattr(rl_evaluation, "evaluate", evaluate)
  config = math_config.get_config(f"ckpt={ckpt},train={DAPO},eval={EVALS},quick")
  config.data.reward_grader = "mipu_jax.testing.graders:parity"  # mixed rewards
  config.export.best = True
  config.logging.plots = False  # not read here
  config.num_steps = 1
  workdir = str(tmp_path / "run")
  first = rl.train(config_lib.from_config_dict(config), workdir)
  assert os.path.isdir(os.path.join(workdir, "checkpoints", "1"))
  best = first.files["export_best"]
  assert best == os.path.join(workdir, "export", "best")
  config.num_steps = 2
  result = rl.train(config_lib.from_config_dict(config), workdir)  # resumes at 1
  assert len(calls) == 3
  # The resumed run compares with step 1's score (kept in the checkpoint).
  best_run = result if calls[2] > calls[1] else first
  assert ("export_best" in result.files) == (best_run is result)
  steps = [int(r["step"]) for r in result.rows]
  assert steps == [0, 1, 2]
  assert result.rows[1] == first.rows[1]  # step 1 was read back, not retrained
  last = result.rows[-1]
  logged = [json.loads(line) for line in open(result.files["metrics"])]
  assert [r["step"] for r in logged] == steps
  for row in (logged[0], logged[-1], result.rows[0], last):  # the evaluated steps
    assert "eval/avg" in row and "eval/avg_se" in row
    for name in ("math500", "aime24", "amc23", "minerva_math", "olympiadbench"):
      assert 0.0 <= row[f"eval/{name}"] <= 1.0
  assert "| math500 | aime24 | amc23 | minerva_math | olympiadbench | Avg. |" in result.table
  assert last["reward/timeouts"] == 0 and "mipu/accepted" in last
  assert any(r.get("actor/grad_norm", 0) > 0 for r in result.rows)  # it learned

  export = result.files["export_final"]
  assert {"config.json", "model.safetensors", "tokenizer.json",
          "generation_config.json"} <= set(os.listdir(export))
  ours = models.from_pretrained(export)
  chex.assert_trees_all_equal(jax.device_get(result.state.params),
                              nnx.to_pure_dict(nnx.state(ours, nnx.Param)))
  hf = transformers.AutoModelForCausalLM.from_pretrained(export, dtype=torch.float32)
  tokens = np.asarray([HFTokenizer.from_dir(export).encode("What is 7 + 8? \\boxed{15}")])
  with torch.no_grad():
    want = hf(torch.tensor(tokens)).logits.numpy()
  np.testing.assert_allclose(np.asarray(ours(tokens).logits), want, atol=1e-4, rtol=1e-4)
  assert transformers.AutoTokenizer.from_pretrained(export).chat_template

  # The best export: the policy of the best evaluation after step 0.
  assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(os.listdir(best))
  ours = models.from_pretrained(best)
  chex.assert_trees_all_equal(jax.device_get(best_run.state.params),
                              nnx.to_pure_dict(nnx.state(ours, nnx.Param)))
  hf = transformers.AutoModelForCausalLM.from_pretrained(best, dtype=torch.float32)
  with torch.no_grad():
    want = hf(torch.tensor(tokens)).logits.numpy()
  np.testing.assert_allclose(np.asarray(ours(tokens).logits), want, atol=1e-4, rtol=1e-4)
