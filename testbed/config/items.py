"""A spec string's parsed items with the text the user typed: `--fail`, `--straggler`. Pure."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar


@dataclass(frozen=True)
class Items:
    """Parsed items; `source` keeps the user's text for messages; str() is the canonical text."""

    items: tuple[Any, ...] = ()
    source: str = field(default="none", compare=False)
    render: ClassVar[Callable[[tuple[Any, ...]], str]]

    def __iter__(self) -> Iterator[Any]:
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)

    def __str__(self) -> str:
        return type(self).render(self.items)
