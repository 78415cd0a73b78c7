"""The outcome of one campaign: trials, failures detected, data lost, and what was seen."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

__all__ = ["CampaignResult"]


@dataclass
class CampaignResult:
    """What a campaign did and found.

    Attributes:
        name: campaign name (``crash``, ``corruption``, ...).
        trials: injected faults / inputs tried.
        detected: trials whose fault was detected or handled as the campaign requires (a clear
            error, a quarantine, a retry that completed, a refusal).
        lost: trials that lost or silently corrupted data, or passed a fault silently; must be 0.
        outcomes: outcome label -> count (the breakdown reported in RELIABILITY.md).
        problems: one line per trial that broke a requirement (empty when the campaign passes).
        notes: free-form lines for the report (timings, measured durations).
    """

    name: str
    trials: int = 0
    detected: int = 0
    lost: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def record(
        self, outcome: str, *, detected: bool, lost: bool = False, problem: str | None = None
    ) -> None:
        """Count one trial."""
        self.trials += 1
        self.detected += int(detected)
        self.lost += int(lost)
        self.outcomes[outcome] += 1
        if problem:
            self.problems.append(problem)

    @property
    def ok(self) -> bool:
        """No data lost and no requirement broken."""
        return self.lost == 0 and not self.problems

    def summary(self) -> str:
        """One paragraph for logs and assertion messages."""
        parts = ", ".join(f"{k}: {v}" for k, v in sorted(self.outcomes.items()))
        text = (
            f"{self.name}: {self.trials} trials, {self.detected} detected/handled, "
            f"{self.lost} lost, {self.seconds:.1f} s ({parts})"
        )
        if self.problems:
            text += "\n  PROBLEMS:\n  - " + "\n  - ".join(self.problems[:30])
        return text
