"""Reproduce the sources' tables: table rows x seeds through the RL loop, then a table and figures.

    result = run_table(make_config, ROWS, seeds=(0, 1), workdir="results/small_cpu")
    print(result.markdown)

`make_config(row, seed, p)` returns the ConfigDict (or `TrainConfig`) of one
table row (`studies/configs/table.py` for the small CPU task); `p` is the
random-rollback probability, set to the rejection rate that the MIPU row
measured with the same seed (docs/method.md §5), which is why seeds are the outer
loop and `mipu` runs before `random_rollback`. Each run goes through
`mipu_jax.rl.train`, the loop's public entry point, into
`workdir/runs/<row>_s<seed>/`; a run that finished before (a `summary.json`
next to its metrics) is read back instead of re-run, so an interrupted
reproduction resumes. Rows whose validated configs are identical (`tis` and
`step1`: Step 1 *is* token TIS, docs/method.md §5) run once and are reported under
both names. A row whose config cannot be built (the MIPU rows before
`config.mipu` exists) is reported as pending, with the reason.

Scores are the loop's periodic evaluation of the inference policy μ: pass@1
averaged over k samples on the five held-out tiers (`eval/<tier>`,
`eval/avg`), the stand-ins of MATH / AIME / Olympiad / Minerva / AMC23.

**Stable** (the sources' last column, whose criterion they do not publish),
fixed before any run: a run is stable when each of its last two evaluations
reaches the best evaluation up to it minus `STABLE_SES` (2) standard errors
of that best evaluation (`eval/avg_se`: the sampling noise of pass@1 over the
eval problems, `mipu_jax.rl.evaluation`), and no metric went non-finite. A run
that peaks early and then falls back by more than its eval noise is not
stable; a run still rising at the end is. A row is stable when every seed is.

Like with like. Every row of a table must hold every setting equal except the
one it is about (the correction preset, the LR schedule, the MIPU switches):
`run_table` checks the rows' validated configs against each other
(`check_like_with_like`) before training anything, and a finished run is read
back only if its saved `config.json` equals the config the row asks for now
(`run_one` refuses otherwise: delete the run directory or fix the config).

Outputs in `workdir`: `table.md` (the tables asked for: by default the MIPU
main table, its ablation, and the random-rollback comparison, in the sources'
layout: tiers, Avg., Stable, plus the eval SE, `k3_kl` and the rollback rate),
`summary.json`, `curves_<table>.png` (reward, eval accuracy, `k3_kl`,
response length, gradient norm, learning rate, rollback rate over steps; mean
over seeds, min-max band) and, when a row ran MIPU Step 2, `gap_post.png`
(the distribution of `T̂_post` and of `T̂_post / SE`, with the rejection
rate).
"""

from studies.reproduce.report import claims_markdown
from studies.reproduce.report import per_seed_markdown
from studies.reproduce.report import perturbation_markdown
from studies.reproduce.report import placement_markdown
from studies.reproduce.report import plot_curves
from studies.reproduce.report import plot_gap
from studies.reproduce.report import plot_lr_decay
from studies.reproduce.report import tables_markdown
from studies.reproduce.table_runs import check_like_with_like
from studies.reproduce.table_runs import committed_placement
from studies.reproduce.table_runs import order_rows
from studies.reproduce.table_runs import perturbation_report
from studies.reproduce.table_runs import run_table
from studies.reproduce.spec import ABLATION_ROWS
from studies.reproduce.spec import CLAIMS
from studies.reproduce.spec import COMPARE_ROWS
from studies.reproduce.spec import COMPARE_TABLES
from studies.reproduce.spec import ISOLATE_CLAIMS
from studies.reproduce.spec import ISOLATE_ROWS
from studies.reproduce.spec import LABELS
from studies.reproduce.spec import MAIN_ROWS
from studies.reproduce.spec import MakeConfig
from studies.reproduce.spec import PANELS
from studies.reproduce.spec import PRECISION_CLAIMS
from studies.reproduce.spec import PRECISION_FIELDS
from studies.reproduce.spec import PRECISION_ROWS
from studies.reproduce.spec import ROLLBACK_ROWS
from studies.reproduce.spec import ROW_FIELDS
from studies.reproduce.spec import SOURCE_TABLES
from studies.reproduce.spec import TABLE_SEEDS
from studies.reproduce.spec import TableResult

__all__ = [
    "ABLATION_ROWS", "CLAIMS", "ISOLATE_CLAIMS", "TABLE_SEEDS", "ISOLATE_ROWS", "COMPARE_ROWS",
    "COMPARE_TABLES", "LABELS", "MAIN_ROWS", "MakeConfig", "PANELS", "PRECISION_CLAIMS",
    "PRECISION_FIELDS", "PRECISION_ROWS", "ROLLBACK_ROWS", "ROW_FIELDS", "SOURCE_TABLES",
    "TableResult", "check_like_with_like", "claims_markdown", "committed_placement", "order_rows",
    "per_seed_markdown", "placement_markdown", "plot_curves", "plot_gap", "plot_lr_decay",
    "run_table", "tables_markdown",
]
