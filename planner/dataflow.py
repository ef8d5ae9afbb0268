"""Where per-token data lives and travels, derived from one declaration of what each phase reads and writes.

A flow is a sequence of ``Phase``s (``planner.phases.declare_flows`` declares the training step's, the validation's and
ReMax's greedy baseline's): each runs on the driver or on the workers and names the per-token keys it reads and
writes. ``Dataflow.of`` derives every worker phase's ``Route`` from that, so nothing else lists keys:

- ``send``: keys it reads whose latest writer ran on the driver (the dataloader, the reward, the advantages);
- ``fetch``: keys it reads whose latest writer ran on the workers: they stayed in the worker's step store;
- ``keep``: keys it writes that a later worker phase reads (before anything writes them again): stored there;
- ``give``: keys it writes that a later driver phase reads: returned to the driver.

With colocation every role of a rank lives in one process, so one store per process serves them all
(``workers/compute/step_store.py``). A read that no earlier phase writes is an error here, when the plan is made.
"""

from __future__ import annotations

from dataclasses import dataclass

DRIVER, WORKER = "driver", "worker"


@dataclass(frozen=True)
class Phase:
    """One step of a flow: where it runs and the per-token keys it reads and writes; ``columns`` are per-row
    non-tensors (the dataloader's) a worker phase reads when the driver's batch has them."""

    name: str
    on: str  # DRIVER or WORKER
    reads: tuple[str, ...] = ()
    writes: tuple[str, ...] = ()
    columns: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.on not in (DRIVER, WORKER):
            raise ValueError(f"phase {self.name!r}: on={self.on!r}, expected {DRIVER!r} or {WORKER!r}")
        object.__setattr__(self, "reads", tuple(dict.fromkeys(self.reads)))  # a key named twice is read once


@dataclass(frozen=True)
class Route:
    """How one worker phase's tensors move (see the module docstring); ``writes`` are all the keys it writes,
    ``columns`` the non-tensors sent along when the driver has them. Non-tensors a phase returns (the agent loop's
    per-row statistics) always go to the driver."""

    phase: str
    send: tuple[str, ...]
    fetch: tuple[str, ...]
    keep: tuple[str, ...]
    give: tuple[str, ...]
    writes: tuple[str, ...]
    columns: tuple[str, ...] = ()

    @property
    def reads(self) -> tuple[str, ...]:
        return self.send + self.fetch


@dataclass(frozen=True)
class Dataflow:
    """A flow's phases, in order, and the route of each of its worker phases."""

    phases: tuple[Phase, ...]
    routes: tuple[Route, ...]

    @classmethod
    def of(cls, phases: tuple[Phase, ...]) -> Dataflow:
        """Derive the routes; ValueError when a phase reads a key that no earlier phase writes."""
        names = [p.name for p in phases]
        if len(set(names)) != len(names):
            raise ValueError(f"phase names repeat in {names}")
        writer: dict[str, Phase] = {}  # key -> the latest phase that wrote it
        routes = []
        for i, phase in enumerate(phases):
            missing = [k for k in phase.reads if k not in writer]
            if missing:
                raise ValueError(f"phase {phase.name!r} reads {missing}, which no earlier phase of {names} writes")
            if phase.on == WORKER:
                later = phases[i + 1 :]
                routes.append(
                    Route(
                        phase=phase.name,
                        send=tuple(k for k in phase.reads if writer[k].on == DRIVER),
                        fetch=tuple(k for k in phase.reads if writer[k].on == WORKER),
                        keep=tuple(k for k in phase.writes if _read_later(k, later, WORKER)),
                        give=tuple(k for k in phase.writes if _read_later(k, later, DRIVER)),
                        writes=phase.writes,
                        columns=phase.columns,
                    )
                )
            writer.update(dict.fromkeys(phase.writes, phase))
        return cls(phases=tuple(phases), routes=tuple(routes))

    def route(self, phase: str) -> Route:
        for route in self.routes:
            if route.phase == phase:
                return route
        raise KeyError(f"no worker phase {phase!r} in this flow; its worker phases: {[r.phase for r in self.routes]}")

    def phase(self, name: str) -> Phase:
        for phase in self.phases:
            if phase.name == name:
                return phase
        raise KeyError(f"no phase {name!r} in this flow: {[p.name for p in self.phases]}")


def when(condition: bool, *items: object) -> tuple:
    """``items`` if ``condition`` else nothing: optional keys and phases inline in a declaration."""
    return items if condition else ()


def _read_later(key: str, later: tuple[Phase, ...], on: str) -> bool:
    """Whether a phase running ``on`` reads ``key`` before a phase writes it again."""
    for phase in later:
        if key in phase.reads and phase.on == on:
            return True
        if key in phase.writes:
            return False
    return False
