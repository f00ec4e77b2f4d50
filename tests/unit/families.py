"""Strategy name -> family, as testbed.registry.families() returns it, without importing Ray.

Unit tests validate configs against this literal; tests/ray/test_cli.py checks it still equals
the registry, so a new strategy cannot drift past the unit tier unnoticed.
"""

FAMILIES = {
    "mapreduce": "mapreduce",
    "ring": "allreduce",
    "allreduce-torch": "allreduce",
    "ps-sync": "ps",
    "ps-async": "ps",
    "gossip": "gossip",
}
