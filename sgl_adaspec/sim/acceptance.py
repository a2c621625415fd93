"""Acceptance model: how good the draft's guesses are, and how often the target agrees.

The simulator never sees tokens. For every node the draft expands it draws the draft's *top-1
probability* q from the request class's Beta distribution; the node's w children then carry draft
probabilities p_k = q * (1 - q)^(k - 1), k = 1..w (the mass left after the better children,
shared geometrically; the sum stays below 1). A child's path probability is f = f(parent) * p_k.

The target agrees with child k of an accepted node with probability c_k = calibration(p_k),
mutually exclusively among siblings (the target emits one token; siblings are scaled down if the
calibrated values sum above 1). So the probability that the whole path to v is accepted is the
product of calibration(p) along it, which equals f(v) when the calibration is the identity
(a perfectly calibrated draft: AdaServe's E[acc] = 1 + sum of f holds exactly). A calibration
below the diagonal is an over-confident draft, above it an under-confident one.

Terms as in `speculative/candidates.py`: accepted tokens are draft tokens on the accepted path;
the bonus token is on top.

The default (`DEFAULT`) is `CALIBRATED_QWEN25CODER`, measured on a real same-tokenizer pair
(Qwen2.5-Coder-1.5B-Instruct target, 0.5B draft; `sim/calibration/` records and fits it, the
JSON ships in `sim/data/`). `SYNTHETIC_DEFAULT` (made-up Betas, identity calibration) stays
available, by name too: `resolve("synthetic-default")`. Other models load with
`AcceptanceModel.load(path)` (JSON; `to_json` writes the format).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class BetaParams:
    """Beta(alpha, beta) distribution of the draft's per-step top-1 probability."""

    alpha: float
    beta: float

    def __post_init__(self) -> None:
        if not (self.alpha > 0 and self.beta > 0):
            raise ValueError(f"Beta parameters must be > 0, got {self.alpha}, {self.beta}")

    @property
    def mean(self) -> float:
        return self.alpha / (self.alpha + self.beta)


@dataclass(frozen=True)
class AcceptanceModel:
    """- name, source: what it is and where its numbers come from (printed with every result);
    - top1: per SLO class, the Beta distribution of the draft's top-1 probability per step;
    - calibration_p / calibration_accept: points of the calibration curve, P(target accepts the
      child | parent accepted) as a function of the child's draft probability p; piecewise
      linear, ascending p from 0 to 1."""

    name: str
    source: str
    top1: dict[str, BetaParams]
    calibration_p: tuple[float, ...] = (0.0, 1.0)
    calibration_accept: tuple[float, ...] = (0.0, 1.0)

    def __post_init__(self) -> None:
        xs, ys = self.calibration_p, self.calibration_accept
        if len(xs) != len(ys) or len(xs) < 2:
            raise ValueError("calibration needs >= 2 points of equal count")
        if xs[0] != 0.0 or xs[-1] != 1.0 or any(b <= a for a, b in zip(xs, xs[1:])):
            raise ValueError(f"calibration_p must ascend strictly from 0 to 1: {xs}")
        if any(not 0.0 <= y <= 1.0 for y in ys):
            raise ValueError(f"calibration_accept values must be in [0, 1]: {ys}")
        if not self.top1:
            raise ValueError("top1 needs at least one class")

    def class_params(self, names: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Beta alpha [C], beta [C] for the given class names, in that order."""
        missing = [n for n in names if n not in self.top1]
        if missing:
            raise KeyError(
                f"acceptance model {self.name!r} has no class {missing}; has {list(self.top1)}"
            )
        return (
            np.array([self.top1[n].alpha for n in names]),
            np.array([self.top1[n].beta for n in names]),
        )

    def calibrate(self, draft_prob: np.ndarray) -> np.ndarray:
        """P(accept | parent accepted) for draft probabilities p (any shape)."""
        return np.interp(draft_prob, self.calibration_p, self.calibration_accept)

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "source": self.source,
            "top1": {k: {"alpha": v.alpha, "beta": v.beta} for k, v in self.top1.items()},
            "calibration": {"p": list(self.calibration_p), "accept": list(self.calibration_accept)},
        }

    @classmethod
    def from_json(cls, data: dict) -> AcceptanceModel:
        unknown = set(data) - {"name", "source", "top1", "calibration"}
        if unknown:
            raise ValueError(f"acceptance model: unknown keys {sorted(unknown)}")
        calibration = data.get("calibration", {"p": [0.0, 1.0], "accept": [0.0, 1.0]})
        return cls(
            name=str(data["name"]),
            source=str(data["source"]),
            top1={
                k: BetaParams(float(v["alpha"]), float(v["beta"])) for k, v in data["top1"].items()
            },
            calibration_p=tuple(float(x) for x in calibration["p"]),
            calibration_accept=tuple(float(y) for y in calibration["accept"]),
        )

    @classmethod
    def load(cls, path: str | Path) -> AcceptanceModel:
        path = Path(path)
        try:
            return cls.from_json(json.loads(path.read_text()))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{path}: bad acceptance model: {exc}") from exc

    def with_calibration(
        self, name: str, p: tuple[float, ...], accept: tuple[float, ...]
    ) -> AcceptanceModel:
        return AcceptanceModel(name, self.source, self.top1, p, accept)


SYNTHETIC_DEFAULT = AcceptanceModel(
    name="synthetic-default",
    source=(
        "synthetic, not measured: per-step draft top-1 probability ~ Beta per class (coding "
        "mean 0.75, chat 0.62, summarization 0.60), perfectly calibrated draft; SGLang's "
        "default tree (5, 4, 8) then commits 2.8-3.7 tokens per verify, bonus included"
    ),
    top1={
        "coding": BetaParams(3.0, 1.0),
        "chat": BetaParams(2.0, 1.2),
        "summarization": BetaParams(1.8, 1.2),
    },
)


CALIBRATED_FILE = "acceptance_qwen25coder.json"


def _load_package_model(filename: str) -> AcceptanceModel:
    text = resources.files("sgl_adaspec.sim").joinpath("data", filename).read_text()
    try:
        return AcceptanceModel.from_json(json.loads(text))
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"sgl_adaspec/sim/data/{filename}: bad acceptance model: {exc}") from exc


# Measured: see the model's `source` and docs/simulator.md ("Calibration on a real pair").
CALIBRATED_QWEN25CODER = _load_package_model(CALIBRATED_FILE)
DEFAULT = CALIBRATED_QWEN25CODER
# Made up, for the promise's other side: the measured pair's draft, accepted a fifth as often
# as there (the same draft probabilities, so the draft is five times over-confident): a draft
# that pays for nothing on a GPU preset, where a policy must see that and stand down.
POOR_DRAFT = AcceptanceModel(
    name="poor-draft",
    source=(
        "made up, not measured: the qwen2.5-coder-1.5b+0.5b model's draft probabilities, its "
        "calibration scaled by 0.2 (each draft token accepted a fifth as often)"
    ),
    top1=CALIBRATED_QWEN25CODER.top1,
    calibration_p=CALIBRATED_QWEN25CODER.calibration_p,
    calibration_accept=tuple(0.2 * y for y in CALIBRATED_QWEN25CODER.calibration_accept),
)
NAMED = {m.name: m for m in (CALIBRATED_QWEN25CODER, SYNTHETIC_DEFAULT, POOR_DRAFT)}


def resolve(spec: str | Path | None) -> AcceptanceModel:
    """None: `DEFAULT`; a name in `NAMED`; else a JSON path."""
    if spec is None:
        return DEFAULT
    if str(spec) in NAMED:
        return NAMED[str(spec)]
    if not Path(spec).is_file():
        raise ValueError(f"acceptance model {spec}: no such file, nor one of {', '.join(NAMED)}")
    return AcceptanceModel.load(spec)


def zero_acceptance(base: AcceptanceModel = SYNTHETIC_DEFAULT) -> AcceptanceModel:
    """The target never accepts a draft token (same draft probabilities, calibration = 0)."""
    return base.with_calibration("zero-acceptance", (0.0, 1.0), (0.0, 0.0))
