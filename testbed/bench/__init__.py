"""Micro-benchmarks: `python -m testbed.bench allreduce` (cli.py), its loop (lib.py), its actors (peers.py)."""
