"""`python -m testbed.docs`: regenerate the documentation's generated parts (generate.py)."""
