"""Discrete-event simulator of one serving instance under the speculation policies.

Modules: `latency` (verify / draft cost presets), `acceptance` (draft quality and calibration),
`trees` (sampled beam-search trees, accept walk), `workload` (Poisson arrivals, class mix),
`policies` (simulator adapters around the server's selection code), `engine` (event loop),
`experiments` (rps-sweep). Run `python -m sgl_adaspec.sim`; see docs/simulator.md.
"""
