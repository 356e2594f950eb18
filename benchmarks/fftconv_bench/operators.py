"""What a run computes (--operator): the causal convolution, or one of the Hyena operators of
issue #30 that monarch_fftconv.fftconv takes (its docstring defines them):

  plain          y = conv(u, k)                              k (C, L)
  gated          y = postgate ⊙ (conv(x, k) + D ⊙ x),        k (C, L), D (C,), both gates u's
                 x = pregate ⊙ u                             shape
  grouped        y = conv(u, k), channel c takes filter      k (C/16, L)
                 c // 16
  bidirectional  y = conv(u, k[:, 0]) + the anti-causal      k (C, 2, L)
                 conv(u, k[:, 1]) (lag 0 takes both)

The shapes of each operator's inputs live here; the methods compute them (methods.py) and the
guard checks them against float64 (guard.py)."""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, Optional, Tuple

# fftconv's keyword inputs besides u and k, in the order a training step differentiates them.
TERMS = ("D", "pregate", "postgate")
# `grouped`: each filter serves this many channels, G = C / 16.
GROUP_SIZE = 16


@dataclasses.dataclass(frozen=True)
class Operator:
    name: str
    definition: str              # in words, for the JSON and the header
    gated: bool = False          # takes D and both gates
    group_size: int = 1          # channels per filter
    bidirectional: bool = False  # (G, 2, L) filters: [:, 0] causal, [:, 1] anti-causal

    @property
    def terms(self) -> Tuple[str, ...]:
        """The keyword inputs it takes besides u and k."""
        return TERMS if self.gated else ()

    @property
    def filter_dims(self) -> str:
        """The filter's shape in letters: '(C,L)', '(C/16,L)', '(C,2,L)'."""
        groups = "C" if self.group_size == 1 else f"C/{self.group_size}"
        return f"({groups},2,L)" if self.bidirectional else f"({groups},L)"

    def filter_shape(self, C: int, L: int) -> Tuple[int, ...]:
        groups = C // self.group_size
        return (groups, 2, L) if self.bidirectional else (groups, L)

    def shape_problem(self, C: int) -> Optional[str]:
        """Why C channels cannot take this operator, or None."""
        if C % self.group_size:
            return (f"--operator {self.name} shares each filter among {self.group_size} channels: "
                    f"C={C} is not a multiple of {self.group_size}")
        return None

    def traffic(self, C: int) -> Dict[str, Any]:
        """What guard.min_bytes counts besides u, y and grad_y: the filter bank's rows of length
        L, the gate tensors of u's shape, and D."""
        return {"filter_rows": C // self.group_size * (2 if self.bidirectional else 1),
                "gates": 2 if self.gated else 0, "skip": self.gated}


OPERATORS: Dict[str, Operator] = {op.name: op for op in (
    Operator("plain", "y = conv(u, k), k (C, L)"),
    Operator("gated", "y = postgate * (conv(x, k) + D * x), x = pregate * u; k (C, L), D (C,), "
                      "pregate and postgate of u's shape", gated=True),
    Operator("grouped", f"y = conv(u, k), k (C/{GROUP_SIZE}, L): channel c takes filter "
                        f"c // {GROUP_SIZE}", group_size=GROUP_SIZE),
    Operator("bidirectional", "y = conv(u, k[:, 0]) + anti-causal conv(u, k[:, 1]), k (C, 2, L): "
                              "the filter spectrum rfft(k[:, 0]) + conj(rfft(k[:, 1])) at n = 2L",
             bidirectional=True),
)}
PLAIN = OPERATORS["plain"]
