"""The SGLang adapter of the speculation policies: the only part of `speculative/` that
imports SGLang. One module per job:
- `hooks`: the hooks around EAGLE v2's iteration (draft, verify, target forward) and the list
  of every hook target (`register`);
- `iteration`: the one declared state of an iteration in progress;
- `runtime`: the process's config, policy and verify cost profile, built once at start-up;
- `request_state`: per-request SLO bookkeeping on SGLang's `Req`;
- `tree`: SGLang's verify tree to and from the policy's `Candidates`;
- `tier_states`: the draft tiers as SGLang runtime states, built at start-up and swapped per
  iteration; `plain_decode`: the steps-0 iteration, warm or cold;
- `draft_tiers` / `early_exit`: the adapters of the draft tiers' beam search and the early
  exit's math (`speculative/draft_tiers.py`, `speculative/early_exit.py`).
"""
