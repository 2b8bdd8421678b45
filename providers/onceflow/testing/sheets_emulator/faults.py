"""Fault injection: 429 with Retry-After, 500, added latency, "apply then fail" and "apply then drop".

A fault rule fires for the next ``count`` matching requests, or with ``probability`` drawn from its
own ``random.Random(seed)`` (reproducible), or, with neither, for every matching request until it
is cleared. Latency rules add up; of the failing kinds the first rule that fires wins.
"""

from __future__ import annotations

import math
import random
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

KINDS = ("429", "500", "latency", "apply_then_fail", "apply_then_drop")
#: kinds whose request is applied (and persisted) before the client is failed
APPLYING = ("apply_then_fail", "apply_then_drop")


@dataclass
class Fault:
    """One fault rule.

    :param kind: ``429``, ``500``, ``latency``, ``apply_then_fail`` (the write lands, the client
        sees a 500) or ``apply_then_drop`` (the write lands, then the connection is closed without
        any response: what a client's transport may answer by sending the request again).
    :param count: fire for the next ``count`` matching requests, then expire.
    :param probability: fire with this probability per matching request.
    :param seed: seed of this rule's random generator (with ``probability``).
    :param methods: only requests to these methods (e.g. ``values.get``); ``None`` means all.
    :param retry_after: seconds sent in the ``Retry-After`` header of a 429; ``None`` sends no
        header.
    :param latency: seconds added before the request is handled (kind ``latency``).
    :param after_apply: for ``apply_then_*``: called with the store, under its lock, after the
        write landed and before the failure is sent: an edit that lands between a request and the
        client's resend of it. In-process only (an emulator running in a test's process); not
        part of the JSON form.
    """

    kind: str
    count: int | None = None
    probability: float | None = None
    seed: int | None = None
    methods: list[str] | None = None
    retry_after: float | None = 1.0
    latency: float = 0.0
    fired: int = 0
    after_apply: Callable[[Any], None] | None = field(default=None, repr=False)
    _rng: random.Random = field(default_factory=random.Random, repr=False)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown fault kind {self.kind!r}; expected one of {KINDS}")
        if self.probability is not None and not 0 <= self.probability <= 1:
            raise ValueError("probability must be between 0 and 1")
        self._rng = random.Random(self.seed)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Fault:
        known = {"kind", "count", "probability", "seed", "methods", "retry_after", "latency"}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown fault fields {sorted(unknown)}")
        return cls(**{**data, "kind": str(data.get("kind", ""))})

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "count": self.count,
            "probability": self.probability,
            "seed": self.seed,
            "methods": self.methods,
            "retry_after": self.retry_after,
            "latency": self.latency,
            "fired": self.fired,
        }

    @property
    def retry_after_header(self) -> str | None:
        if self.retry_after is None:
            return None
        return str(max(0, math.ceil(self.retry_after)))

    def _fires(self, method: str) -> bool:
        if self.methods is not None and method not in self.methods:
            return False
        if self.count is not None and self.count <= 0:
            return False
        if self.probability is not None and self._rng.random() >= self.probability:
            return False
        if self.count is not None:
            self.count -= 1
        self.fired += 1
        return True


@dataclass
class Decision:
    """What to do with one request: wait ``latency`` seconds, then fail or not."""

    latency: float = 0.0
    failure: Fault | None = None


class FaultInjector:
    """The active fault rules of one emulator; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rules: list[Fault] = []

    def add(self, fault: Fault | str, **options: Any) -> Fault:
        """Arm a fault rule: ``add("429", count=2, retry_after=1)`` or ``add(Fault(...))``.

        :param fault: a :class:`Fault`, or its kind.
        :param options: the other :class:`Fault` fields when ``fault`` is a kind.
        """
        if isinstance(fault, str):
            fault = Fault(kind=fault, **options)
        with self._lock:
            self._rules.append(fault)
        return fault

    def clear(self) -> None:
        with self._lock:
            self._rules.clear()

    def rules(self) -> list[dict[str, Any]]:
        with self._lock:
            return [r.to_json() for r in self._rules]

    def decide(self, method: str) -> Decision:
        decision = Decision()
        with self._lock:
            for rule in self._rules:
                if rule.kind == "latency":
                    if rule._fires(method):
                        decision.latency += rule.latency
                elif decision.failure is None and rule._fires(method):
                    decision.failure = rule
            # Expired count-limited rules go away so listing shows what is still armed.
            self._rules = [r for r in self._rules if r.count is None or r.count > 0]
        return decision
