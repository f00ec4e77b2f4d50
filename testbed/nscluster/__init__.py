"""`python -m testbed.nscluster`: a multi-node Ray cluster in network namespaces on one machine
(cli.py)."""
