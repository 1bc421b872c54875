"""`python -m mipu_jax.testing.campaign`: the campaign's table (docs/reliability.md)."""
from mipu_jax.testing.campaign import main

main()
