"""The policy's `runner:` block (how inputs are synthesised and how long to measure), plus command-line overrides."""

from __future__ import annotations

from dataclasses import dataclass, field

from ortgate.config.policy import Policy
from ortgate.errors import InputError
from ortgate.findings import Location

DEFAULT_WARMUP = 3
DEFAULT_ITERATIONS = 20


@dataclass(frozen=True)
class RunnerSettings:
    """Step shape and measurement length. Unset step values fall back to a single-token decode step."""

    batch_size: int = 1
    sequence_length: int = 1
    past_sequence_length: int = 0
    max_sequence_length: int | None = None
    dims: dict[str, int] = field(default_factory=dict)  # explicit value per symbolic dim name
    warmup: int = DEFAULT_WARMUP
    iterations: int = DEFAULT_ITERATIONS
    timeout_s: float | None = None
    explicit: frozenset[str] = frozenset()  # runner keys the policy (or command line) set
    locations: dict[str, Location] = field(default_factory=dict)  # runner key (or "dims.NAME") -> where

    def where(self, key: str) -> Location | None:
        return self.locations.get(key)


def runner_settings(policy: Policy | None, *, warmup: int | None = None, iterations: int | None = None,
                    timeout_s: float | None = None) -> RunnerSettings:
    block = (policy.get("runner") if policy else None) or {}
    locations: dict[str, Location] = {}
    if policy is not None:
        for key in block:
            locations[key] = policy.where("runner", key)
        for name in block.get("dims") or {}:
            locations[f"dims.{name}"] = policy.where("runner", "dims", name)
    values = {k: block[k] for k in ("batch_size", "sequence_length", "past_sequence_length", "max_sequence_length",
                                    "warmup", "iterations", "timeout_s") if k in block}
    explicit = set(values)
    for key, value in (("warmup", warmup), ("iterations", iterations), ("timeout_s", timeout_s)):
        if value is not None:
            values[key] = value
            explicit.add(key)
    if values.get("warmup", 0) < 0:
        raise InputError(f"--warmup must be 0 or more, got {values['warmup']}")
    if values.get("iterations", 1) < 1:
        raise InputError(f"--iterations must be 1 or more, got {values['iterations']}")
    if values.get("timeout_s") is not None and values["timeout_s"] <= 0:
        raise InputError(f"--timeout must be more than 0 seconds, got {values['timeout_s']}")
    return RunnerSettings(dims=dict(block.get("dims") or {}), explicit=frozenset(explicit), locations=locations,
                          **values)
