"""The strategy contract and the table of strategies.

    contract.py   what the harness knows of a strategy: StrategySpec (pure, before Ray) and
                  Strategy (its Ray shell); Prediction, Variant, Equivalence
    registry.py   name -> spec, one line per strategy; it hands their config sections to the config

They sit in two layers: the contract below the runtime and the strategy packages, the registry
above them (tests/unit/test_layers.py).
"""
