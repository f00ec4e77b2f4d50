"""Decentralised training: gossip SGD (topology.py is the pure part, strategy.py the actors)."""
