"""The lowest layer: sizes, rates and durations as the user writes them (units.py), and cutting a
buffer into near-equal pieces (split.py). Pure."""
