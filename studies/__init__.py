"""This repository's own studies, apart from the library: their configs
(`studies/configs/`), the reproduced tables, the lr and long-horizon studies
(`studies/reproduce/`) and the mismatch sweep.

Not installed with `mipu_jax`, and the library never imports it. Scripts find
it with the repository root on `sys.path`: run them as modules from the clone
(`python -m experiments.compare`); pytest adds the root (`pythonpath = .`).
"""
