"""A request's SLO as the client states it in `custom_params`, validated at the HTTP boundary.

Fields (SGLang's per-request `custom_params`; `sampling_params.custom_params` on /generate,
top-level `custom_params` on the OpenAI-compatible endpoints, `extra_body` in the openai client):
- `tpot_slo_ms`: a number, the TPOT target in ms per output token;
- `slo_class`: the name of a class of the SLO config;
- `ttft_slo_ms` (optional, with either or neither): the time-to-first-token target in ms, used
  by SLO-aware admission.
Giving both `tpot_slo_ms` and `slo_class` is accepted only when the class is absolute and states the same target.
On the OpenAI-compatible endpoints the same fields may come in OpenAI's `metadata` object
(string values, as OpenAI's API has them) when `custom_params` is absent: `sglang-router`
forwards `metadata` on chat requests where it drops `custom_params` (docs/parallel.md).
A ValueError raised here becomes SGLang's HTTP 400 (or the Engine's exception).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from sgl_adaspec.scheduler.slo_config import BEST_EFFORT, SloConfig, check_tpot_ms

TPOT_FIELD = "tpot_slo_ms"
CLASS_FIELD = "slo_class"
CUSTOM_CLASS = "custom"  # the class of a request stating a bare tpot_slo_ms
TTFT_FIELD = "ttft_slo_ms"


@dataclass(frozen=True)
class RequestSlo:
    """What a request asked for: a class name (BEST_EFFORT for none) and, when known, its TPOT."""

    slo_class: str
    tpot_slo_ms: float | None = None
    baseline_multiple: float | None = None
    ttft_slo_ms: float | None = None

    @property
    def best_effort(self) -> bool:
        return self.tpot_slo_ms is None and self.baseline_multiple is None

    def resolve_ms(self, baseline_tpot_ms: float | None) -> float | None:
        """The TPOT target in ms; None for best effort, or for a relative class while the
        baseline TPOT is unknown."""
        if self.tpot_slo_ms is not None:
            return self.tpot_slo_ms
        if self.baseline_multiple is not None and baseline_tpot_ms is not None:
            return self.baseline_multiple * baseline_tpot_ms
        return None


def slo_params_of_metadata(metadata) -> dict | None:
    """The SLO fields of an OpenAI `metadata` object as `custom_params`, numbers parsed from
    their text; None when it names none. A value that is not a number is kept as given, so
    `parse_request_slo` rejects it naming the field."""
    if not isinstance(metadata, dict):
        return None
    params = {
        key: metadata[key] for key in (TPOT_FIELD, CLASS_FIELD, TTFT_FIELD) if key in metadata
    }
    for key in (TPOT_FIELD, TTFT_FIELD):
        if isinstance(params.get(key), str):
            try:
                params[key] = float(params[key])
            except ValueError:
                pass
    return params or None


# Request headers that carry an SLO where a body's fields do not cross a proxy (sglang-router
# re-serializes bodies and drops `custom_params` on /generate and chat).
SLO_HEADERS = {"x-slo-tpot-ms": TPOT_FIELD, "x-slo-ttft-ms": TTFT_FIELD, "x-slo-class": CLASS_FIELD}
# The same under names sglang-router 0.3.2 forwards: it passes on a fixed set of request headers
# (x-request-id and any `x-request-id-*` among them) and drops the `x-slo-*` ones on every
# endpoint (docs/parallel.md).
ROUTER_SLO_HEADERS = {
    "x-request-id-slo-tpot-ms": TPOT_FIELD,
    "x-request-id-slo-ttft-ms": TTFT_FIELD,
    "x-request-id-slo-class": CLASS_FIELD,
}
ALL_SLO_HEADERS = {**SLO_HEADERS, **ROUTER_SLO_HEADERS}


def slo_params_of_headers(headers, config: SloConfig) -> dict | None:
    """The SLO fields of a request's headers (`ALL_SLO_HEADERS`) as `custom_params`, checked;
    None when it has none. A bad value, or two names of one field that disagree, raises
    ValueError naming the header."""
    params, named = {}, {}
    for header, field in ALL_SLO_HEADERS.items():
        value = headers.get(header)
        if value is None:
            continue
        if field != CLASS_FIELD:
            try:
                value = float(value)
            except ValueError:
                raise ValueError(f"header {header} must be a number of ms, got {value!r}") from None
        if field in params and params[field] != value:
            raise ValueError(f"headers {named[field]} and {header} disagree")
        params[field], named[field] = value, header
    if not params:
        return None
    try:
        parse_request_slo(params, config)
    except ValueError as exc:
        raise ValueError(f"headers {', '.join(named.values())}: {exc}") from None
    return params


def with_header_slo(custom_params, header_params: dict | None):
    """`custom_params` with the headers' SLO fields where the body states no SLO (the body's
    SLO wins when both are given)."""
    if header_params is None or not (custom_params is None or isinstance(custom_params, dict)):
        return custom_params
    body = custom_params or {}
    if any(field in body for field in (TPOT_FIELD, CLASS_FIELD, TTFT_FIELD)):
        return custom_params
    return {**body, **header_params}


def parse_request_slo(custom_params, config: SloConfig) -> RequestSlo:
    if custom_params is None:
        custom_params = {}
    if not isinstance(custom_params, dict):
        raise ValueError(f"custom_params must be an object, got {type(custom_params).__name__}")
    ttft = None
    if TTFT_FIELD in custom_params:
        ttft = check_tpot_ms(custom_params[TTFT_FIELD], TTFT_FIELD)
    return dataclasses.replace(_parse_tpot_slo(custom_params, config), ttft_slo_ms=ttft)


def _parse_tpot_slo(custom_params: dict, config: SloConfig) -> RequestSlo:
    has_tpot, has_class = TPOT_FIELD in custom_params, CLASS_FIELD in custom_params
    tpot = check_tpot_ms(custom_params[TPOT_FIELD], TPOT_FIELD) if has_tpot else None
    if not has_class:
        if tpot is not None:
            return RequestSlo(CUSTOM_CLASS, tpot_slo_ms=tpot)
        return _class_slo(config.default, config)
    name = custom_params[CLASS_FIELD]
    if not isinstance(name, str):
        raise ValueError(f"{CLASS_FIELD} must be a string, got {name!r}")
    if name != BEST_EFFORT and name not in config.classes:
        known = ", ".join([*config.classes, BEST_EFFORT])
        raise ValueError(f"{CLASS_FIELD} {name!r} is not a known SLO class (known: {known})")
    slo = _class_slo(name, config)
    if tpot is not None and slo.tpot_slo_ms != tpot:
        raise ValueError(
            f"{TPOT_FIELD}={tpot:g} conflicts with {CLASS_FIELD} {name!r} "
            f"({_describe(slo)}); give one of the two"
        )
    return slo


def _class_slo(name: str, config: SloConfig) -> RequestSlo:
    if name == BEST_EFFORT:
        return RequestSlo(BEST_EFFORT)
    cls = config.classes[name]
    return RequestSlo(name, tpot_slo_ms=cls.tpot_ms, baseline_multiple=cls.baseline_multiple)


def _describe(slo: RequestSlo) -> str:
    if slo.tpot_slo_ms is not None:
        return f"{slo.tpot_slo_ms:g} ms"
    if slo.baseline_multiple is not None:
        return f"{slo.baseline_multiple:g}x the baseline TPOT"
    return "best effort"
