"""The Weights & Biases backend: every `wandb` call of the package is here.

A run's W&B run lives in `workdir/wandb/` and its id in
`workdir/wandb_run.json`, so rerunning the same command (a resume) continues
the same W&B run (`wandb.init(id=..., resume="allow")`) instead of starting a
second one.

**Every step once, in order.** A resumed training run restarts after its
checkpoint, but W&B may already hold some later steps (logged before the
kill) or miss some earlier ones (W&B's service keeps the newest records in a
buffer, lost when the process is killed: about 15 s of them, its
`x_transaction_log_flush_interval`). So the backend asks W&B which step it
holds last and logs only later ones: online, W&B's own resume says so
(`run.step`, the step of the next `log`); offline, the run's earlier
transaction logs (`offline-run-*-<id>/run-<id>.wandb`) say so
(`history_steps`). The loop replays the kept `metrics.jsonl` rows through
`write`, so the steps W&B lost are filled in from the log, and the steps it
already holds are skipped.
"""

import datetime
import glob
import json
import logging
import os
import re
import secrets
import struct
import time
import zlib
from typing import Any, Mapping, Optional

_log = logging.getLogger(__name__)

ID_FILE = "wandb_run.json"
# W&B's transaction log: a 7-byte header (":W&B", magic, version), then
# LevelDB-log records (7-byte header: CRC-32, length, type) in 32 KiB blocks.
_HEADER_LEN = 7
_BLOCK = 32768
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def _records(path: str):
  """The complete records of one transaction log; stops at a torn one."""
  with open(path, "rb") as f:
    data = f.read()
  if data[:4] != b":W&B":
    raise ValueError(f"{path} is not a W&B transaction log.")
  i, pending = _HEADER_LEN, None
  while i + 7 <= len(data):
    if _BLOCK - i % _BLOCK < 7:  # block trailer padding
      i += _BLOCK - i % _BLOCK
      continue
    crc, length, kind = struct.unpack("<IHB", data[i:i + 7])
    chunk = data[i + 7:i + 7 + length]
    if kind == 0 or len(chunk) < length:
      return  # zeros past the end, or a record cut short by a kill
    if zlib.crc32(chunk, zlib.crc32(bytes([kind]))) & 0xFFFFFFFF != crc:
      return
    i += 7 + length
    if kind == _FULL:
      yield chunk
    elif kind == _FIRST:
      pending = chunk
    elif kind == _MIDDLE and pending is not None:
      pending += chunk
    elif kind == _LAST and pending is not None:
      yield pending + chunk
      pending = None


def _parsed(path: str, kind: str):
  from wandb.proto import wandb_internal_pb2  # pylint: disable=g-import-not-at-top
  for chunk in _records(path):
    record = wandb_internal_pb2.Record()
    record.ParseFromString(chunk)
    if record.WhichOneof("record_type") == kind:
      yield getattr(record, kind)


def history_steps(path: str) -> list[int]:
  """The history steps (`_step`) of one W&B transaction log (`run-<id>.wandb`),
  in the order written."""
  return [int(h.step.num) for h in _parsed(path, "history")]


def history(path: str) -> list[dict[str, Any]]:
  """The history rows of one W&B transaction log, `{key: value}` with `_step`."""
  return [{item.key or "/".join(item.nested_key): json.loads(item.value_json)
           for item in h.item} for h in _parsed(path, "history")]


def run_record(path: str):
  """The run record (project, name, group, tags, config) of a transaction log."""
  return next(_parsed(path, "run"))


def offline_logs(workdir: str, run_id: str) -> list[str]:
  """The transaction logs of the run's offline attempts, oldest first.

  An attempt's directory is `offline-run-<YYYYMMDD_HHMMSS>-<id>`, with `-<n>`
  appended by W&B when an earlier attempt started in the same second.
  """
  pattern = re.compile(rf"offline-run-(\d{{8}}_\d{{6}})-{re.escape(run_id)}(?:-(\d+))?")
  found = []
  for path in glob.glob(os.path.join(workdir, "wandb", f"offline-run-*-{run_id}*")):
    match = pattern.fullmatch(os.path.basename(path))
    log = os.path.join(path, f"run-{run_id}.wandb")
    if match and os.path.exists(log):
      found.append(((match.group(1), int(match.group(2) or 0)), log))
  return [log for _, log in sorted(found)]


def _last_offline_step(workdir: str, run_id: str) -> int:
  last = -1
  for path in offline_logs(workdir, run_id):
    try:
      last = max([last, *history_steps(path)])
    except Exception as e:  # pylint: disable=broad-except
      _log.warning("Could not read W&B's offline log %s (%s); steps it holds may "
                   "be logged again.", path, e)
  return last


def _run_id(workdir: str) -> str:
  path = os.path.join(workdir, ID_FILE)
  if os.path.exists(path):
    with open(path) as f:
      return json.load(f)["id"]
  run_id = secrets.token_hex(6)  # W&B ids: letters and digits
  with open(path, "w") as f:
    json.dump({"id": run_id}, f)
  return run_id


def _after_earlier_attempts(workdir: str, run_id: str) -> None:
  """Waits until the second after the newest earlier attempt's start has passed.

  W&B names an attempt's directory by the second it starts; a second attempt
  within the same second gets a `-1` directory whose transaction log W&B
  (0.31) leaves empty. A restarted training run is slower than that; a test
  may not be.
  """
  stamps = [re.search(r"run-(\d{8}_\d{6})-", os.path.basename(p))
            for p in glob.glob(os.path.join(workdir, "wandb", f"*run-*-{run_id}*"))]
  stamps = [m.group(1) for m in stamps if m]
  if stamps:
    newest = datetime.datetime.strptime(max(stamps), "%Y%m%d_%H%M%S").timestamp()
    wait = newest + 1.1 - time.time()
    if wait > 0:
      time.sleep(wait)


class WandbSink:
  """Logs rows to one W&B run, continued across resumes.

  Args:
    workdir: the run directory.
    cfg: `mipu_jax.config.WandbConfig`.
    run_config: the run's config as JSON (recorded in W&B's config).

  Raises:
    Whatever `import wandb` or `wandb.init` raises (the writer turns it into
    a start-up error).
  """

  def __init__(self, workdir: str, cfg: Any, run_config: Optional[Mapping[str, Any]]):
    import wandb  # pylint: disable=g-import-not-at-top
    self.run_id = _run_id(workdir)
    _after_earlier_attempts(workdir, self.run_id)
    name = cfg.name or os.path.basename(os.path.abspath(workdir))
    self._run = wandb.init(
        project=cfg.project, entity=cfg.entity or None, name=name,
        group=cfg.group or None, tags=list(cfg.tags) or None,
        config=dict(run_config or {}), id=self.run_id, resume="allow", dir=workdir,
        mode=cfg.mode or None, reinit="finish_previous")
    offline = self._run.settings.mode == "offline"
    held = _last_offline_step(workdir, self.run_id) if offline else -1
    # Online, W&B's resume knows the next step (0 for a new run).
    self.next_step = max(int(self._run.step), held + 1)
    if self.next_step:
      _log.info("W&B run %s holds steps up to %d; logging from step %d on.",
                self.run_id, self.next_step - 1, self.next_step)

  def write(self, step: int, metrics: Mapping[str, float]) -> None:
    if step < self.next_step:
      return  # W&B holds it already (logged before a resume)
    self._run.log(dict(metrics), step=int(step), commit=True)
    self.next_step = int(step) + 1

  def close(self) -> None:
    self._run.finish()
