"""Thin launchers: each parses flags and calls the library; run from the clone root as
`python -m experiments.<name>`."""
