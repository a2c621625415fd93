"""Every hook the plugin registers on SGLang, in one table: where SGLang calls the target, what
the hook reads and writes, and why it is safe where it runs.

On CUDA SGLang replays the draft (and the draft extend and target verify) from graphs captured
at start-up: Python inside a captured region runs once, at capture. A hook on a function SGLang
calls there (`captured=True`) may only add tensor work whose outputs the graph itself returns,
or pass through by a branch fixed at capture. Every other hook is guarded: called inside a
captured region (the CPU emulation's capture or replay, `graph_emulation.sealed`), it raises
`CaptureSafetyError`, so a hook that lands in a captured region undeclared fails the emulated
end-to-end tests. docs/architecture.md shows this table
(`python -m sgl_adaspec.adapters.hook_table`).
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

Kind = Literal["before", "after", "around", "replace"]


class CaptureSafetyError(RuntimeError):
    """A hook ran inside a captured region that the table does not declare safe there."""


@dataclass(frozen=True)
class Hook:
    target: str  # SGLang's function, dotted path
    hook: str  # the plugin's function, "module:name" (for "replace": the object put there)
    kind: Kind
    why: str  # what it reads and writes; where captured, why a replay keeps it correct
    captured: bool = False  # SGLang calls target inside a captured region on CUDA
    cpu_path: bool = False  # registered on the plugin's torch CPU path only

    def function(self) -> Callable:
        module, name = self.hook.split(":")
        return getattr(importlib.import_module(module), name)


SRT = "sglang.srt"
ADAPTERS = "sgl_adaspec.adapters"
LOADS = f"{ADAPTERS}.dp_transport"
SPEC = f"{ADAPTERS}.speculative.hooks"
CPU = f"{ADAPTERS}.platform.cpu.hooks"
WORKER = f"{SRT}.speculative.eagle_worker_v2.EAGLEWorkerV2"
DRAFT = f"{SRT}.speculative.eagle_worker_v2.EagleDraftWorker"
KERNELS = "sglang.kernels.ops.speculative"
ROUTED = "on CUDA SGLang's own kernel, chosen by the tensors' device (fixed at capture)"

HOOKS: tuple[Hook, ...] = (
    # Start-up and requests: no captured region near them.
    Hook(f"{SRT}.server_args.ServerArgs.add_cli_args", f"{ADAPTERS}.cli:add_cli_args", "after",
         "adds the plugin's flags to SGLang's parser"),
    Hook(f"{SRT}.server_args.ServerArgs.from_cli_args", f"{ADAPTERS}.cli:from_cli_args", "around",
         "checks the plugin's flags, publishes ADASPEC_CONFIG"),
    Hook(f"{SRT}.arg_groups.speculative_hook.handle_speculative_decoding",
         f"{ADAPTERS}.cli:check_resolved_draft", "after", "refuses draft shapes it cannot serve"),
    Hook(f"{SRT}.sampling.sampling_params.SamplingParams.verify",
         f"{ADAPTERS}.plugin:_validate_request_slo", "after", "a bad SLO is the request's 400"),
    Hook(f"{SRT}.managers.tokenizer_manager.TokenizerManager._validate_one_request",
         f"{ADAPTERS}.plugin:_check_prompt_ids", "after",
         "empty or out-of-vocabulary prompts: 400"),
    Hook(f"{SRT}.entrypoints.openai.serving_base.OpenAIServingBase.handle_request",
         f"{ADAPTERS}.plugin:_slo_from_openai_metadata", "around",
         "SLO from OpenAI metadata or the SLO headers"),
    Hook(f"{SRT}.entrypoints.http_server.serve_generate_request",
         f"{ADAPTERS}.plugin:_slo_from_generate_headers", "around", "SLO from the SLO headers"),
    Hook(f"{SRT}.entrypoints.http_server._setup_and_run_http_server",
         f"{ADAPTERS}.fleet_view:add_routes", "before", "adds GET /adaspec/slo_load (fleet view)"),
    Hook(f"{SRT}.layers.rotary_embedding.base.RotaryEmbedding.__init__", f"{CPU}:rope_init",
         "around", "model load: a placeholder for vllm's rotary import on CPU"),
    Hook(f"{SRT}.managers.scheduler.Scheduler.__init__",
         f"{ADAPTERS}.speculative.runtime:scheduler_started", "after",
         "builds the policy, the cost profile and the draft tiers (their graphs captured here)"),
    Hook(f"{SRT}.managers.schedule_batch.Req.update_finish_state",
         f"{ADAPTERS}.speculative.request_state:request_finished", "after",
         "per-request SLO statistics"),
    Hook(f"{SRT}.managers.scheduler_components.internal_state.SchedulerInternalStateController."
         "_add_speculative", f"{ADAPTERS}.speculative.runtime:add_internal_state", "after",
         "/server_info's adaspec state"),
    Hook(f"{SRT}.managers.tokenizer_control_mixin.TokenizerControlMixin.get_internal_state",
         f"{ADAPTERS}.speculative.runtime:internal_states_with_total", "around",
         "the replicas' total under --dp"),
    Hook(f"{SRT}.managers.schedule_policy.SchedulePolicy.calc_priority",
         f"{ADAPTERS}.scheduler:order_waiting_queue", "after", "SLO-aware admission"),
    Hook(f"{SRT}.managers.scheduler._make_abort_req",
         f"{ADAPTERS}.scheduler:name_queue_limit", "before", "names the limit hit"),
    Hook(f"{SRT}.managers.schedule_policy.PrefillAdder.__init__",
         f"{ADAPTERS}.scheduler:bound_prefill", "before", "SLO-bounded prefill"),
    Hook(f"{SRT}.managers.data_parallel_controller.DataParallelController.__init__",
         f"{ADAPTERS}.dp:controller_started", "after", "SLO-aware DP dispatch"),
    Hook(f"{SRT}.managers.data_parallel_controller.DataParallelController.event_loop",
         f"{ADAPTERS}.dp:controller_event_loop", "around", "SLO-aware dispatch"),
    Hook(f"{SRT}.managers.scheduler_components.load_inquirer.SchedulerLoadInquirer.get_loads",
         f"{LOADS}:with_report", "after", "the replica's DP report in its load snapshot"),
    Hook(f"{SRT}.managers.scheduler.Scheduler.publish_load_snapshot",
         f"{LOADS}:publish_when_report_due", "before", "publishes a due DP report at once"),
    Hook(f"{SRT}.managers.load_snapshot.snapshot_decoder", f"{LOADS}:SnapshotDecoder",
         "replace", "a module attribute: decodes snapshots keeping the DP report"),
    Hook(f"{SRT}.managers.load_snapshot.zmq_reader_owner", f"{LOADS}:controller_collects",
         "around", "the DP controller collects zmq snapshots under --slo-dispatch on"),
    # One speculative iteration, outside every captured region: the driver, the decision and
    # the tier switch (a decision reaches a graph only as its inputs: which tier's graphs run,
    # the tree pruned before the verify).
    Hook(f"{WORKER}.forward_batch_generation", f"{SPEC}:forward_batch_generation", "around",
         "the iteration's scope, plan, tier and one observe of its outcome"),
    Hook(f"{DRAFT}.draft", f"{SPEC}:draft", "around", "a deferred top-k computed first"),
    Hook(f"{SRT}.speculative.eagle_draft_cuda_graph_runner.EAGLEDraftCudaGraphRunner."
         "_replay_graph", f"{SPEC}:replayed_draft", "around",
         "right after a draft replay: reads the graph's DraftOutputs.path_prob, copies it out"),
    Hook(f"{SRT}.speculative.eagle_draft_extend_cuda_graph_runner."
         "EAGLEDraftExtendCudaGraphRunner._replay_graph", f"{SPEC}:replayed_draft_extend",
         "around", "right after a draft extend replay: counts it"),
    Hook(f"{WORKER}.verify", f"{SPEC}:verify", "around",
         "decides and prunes the tree before SGLang's verify (and its graph) runs"),
    Hook(f"{SRT}.managers.tp_worker.TpModelWorker.forward_batch_generation",
         f"{SPEC}:target_forward", "around",
         "ragged verify on the torch backend; elsewhere passes through to the verify graph"),
    Hook(f"{DRAFT}._draft_extend_for_decode", f"{SPEC}:draft_extend_for_decode", "around",
         "sets the extend's width before its graph runs (an input)"),
    Hook(f"{DRAFT}._draft_extend_for_prefill",
         f"{ADAPTERS}.speculative.blind_prefill:draft_extend_for_prefill", "around",
         "skips the draft's prefill where the policy asked"),
    # Inside captured regions.
    Hook(f"{DRAFT}.draft_forward", f"{SPEC}:draft_forward", "around",
         "the draft graph's callable: tensor work only, its path probabilities returned in "
         "DraftOutputs; hands them to the iteration only when called eagerly inside one",
         captured=True),
    Hook(f"{SRT}.speculative.eagle_utils.organize_draft_results",
         f"{SPEC}:organize_draft_results", "around",
         "gathers the kept nodes' path probabilities (tensor work) for draft_forward's outputs",
         captured=True),
    Hook(f"{SRT}.models.llama.LlamaModel.forward",
         f"{ADAPTERS}.speculative.early_exit:llama_model_forward", "around",
         "passes through unless the eager ragged verify of the torch backend set an exit run",
         captured=True),
    # The CPU path: torch versions of SGLang's CUDA/Triton-only pieces, inert on CUDA.
    Hook(f"{KERNELS}.spec_tree.build_tree_kernel_efficient_func", f"{CPU}:build_tree_on_cpu",
         "around", ROUTED, captured=True, cpu_path=True),
    Hook(f"{KERNELS}.spec_tree.verify_tree_greedy_func", f"{CPU}:verify_tree_greedy_on_cpu",
         "around", ROUTED, captured=True, cpu_path=True),
    Hook(f"{KERNELS}.cache_locs.assign_draft_cache_locs_contiguous_func",
         f"{CPU}:assign_draft_cache_locs_on_cpu", "around", ROUTED, captured=True, cpu_path=True),
    Hook(f"{KERNELS}.cache_locs.assign_extend_cache_locs_func",
         f"{CPU}:assign_extend_cache_locs_on_cpu", "around", ROUTED, captured=True, cpu_path=True),
    Hook(f"{KERNELS}.cache_locs.fill_front_out_cache_loc_func",
         f"{CPU}:fill_front_out_cache_loc_on_cpu", "around", ROUTED, captured=True, cpu_path=True),
    Hook(f"{KERNELS}.eagle.fill_bonus_tokens_func", f"{CPU}:fill_bonus_tokens_on_cpu", "around",
         ROUTED, captured=True, cpu_path=True),
    Hook(f"{KERNELS}.eagle.fill_accept_out_cache_loc_func",
         f"{CPU}:fill_accept_out_cache_loc_on_cpu", "around", ROUTED, captured=True,
         cpu_path=True),
    Hook(f"{SRT}.mem_cache.allocation.assign_req_to_token_pool_func",
         f"{CPU}:assign_req_to_token_pool_on_cpu", "around", ROUTED, captured=True, cpu_path=True),
    Hook(f"{SRT}.managers.overlap_utils.gather_spec_extras", f"{CPU}:gather_spec_extras_on_cpu",
         "around", ROUTED, captured=True, cpu_path=True),
    Hook(f"{SRT}.speculative.spec_utils._select_top_k_tokens_later", f"{CPU}:eager_on_cpu",
         "around", "the draft's beam step: on CUDA SGLang's compiled one, chosen by device",
         captured=True, cpu_path=True),
    Hook(f"{SRT}.arg_groups.speculative_hook._disable_overlap_schedule_for_cpu",
         f"{CPU}:keep_overlap_schedule", "around", "keeps SGLang's overlap schedule on CPU",
         cpu_path=True),
    Hook(f"{SRT}.mem_cache.memory_pool.MHATokenToKVPool._init_kv_copy_and_warmup",
         f"{CPU}:kv_copy_init", "around", "SGLang's torch KV move on CPU", cpu_path=True),
    Hook(f"{SRT}.speculative.draft_utils.DraftBackendFactory.create_decode_backend",
         f"{CPU}:create_draft_decode_backend", "around", "the torch draft attention on CPU",
         cpu_path=True),
    Hook(f"{SRT}.speculative.draft_utils.DraftBackendFactory.create_draft_extend_backend",
         f"{CPU}:create_draft_extend_backend", "around", "the torch extend attention on CPU",
         cpu_path=True),
    Hook(f"{DRAFT}._capture_cuda_graphs", "sgl_adaspec.adapters.platform.cpu.graph_emulation:"
         "capture_cuda_graphs", "around",
         "ADASPEC_EMULATE_GRAPHS=1: SGLang's draft graph runner on CPU, emulated", cpu_path=True),
    Hook(f"{SRT}.model_executor.model_runner.ModelRunner.init_cuda_graphs",
         f"{ADAPTERS}.platform.cpu.graph_emulation:capture_verify_graphs", "after",
         "ADASPEC_EMULATE_GRAPHS=1: SGLang's target verify graph runner on CPU, emulated",
         cpu_path=True),
    Hook(f"{SRT}.model_executor.forward_batch_info.ForwardMode.is_cpu_graph",
         f"{ADAPTERS}.platform.cpu.graph_emulation:target_verify_replays", "around",
         "ADASPEC_EMULATE_GRAPHS=1: the verify runs as its graph's replay; a branch on the "
         "forward mode and an environment flag, both fixed at capture", captured=True,
         cpu_path=True),
)  # fmt: skip


def guarded(hook: Hook) -> Callable:
    """The function registered for `hook`: as it is where the table declares it captured (and
    for coroutines, which no captured region runs); otherwise refusing to run in one."""
    function = hook.function()
    if hook.captured or hook.kind == "replace" or inspect.iscoroutinefunction(function):
        return function  # a replacement is an object SGLang's registry puts in place as is
    from sgl_adaspec.adapters.platform.cpu.graph_emulation import sealed

    @functools.wraps(function)
    def outside_captured_regions(*args, **kwargs):
        if sealed():
            raise CaptureSafetyError(
                f"sgl_adaspec: the hook on {hook.target} ran inside a captured region; "
                "sgl_adaspec/adapters/hook_table.py does not declare it capture-safe"
            )
        return function(*args, **kwargs)

    return outside_captured_regions


def register(registry, hook_type, cpu_path: bool = True) -> None:
    """Every hook of the table on SGLang's `HookRegistry` (`cpu_path`: with the CPU ones)."""
    for hook in HOOKS:
        if hook.cpu_path and not cpu_path:
            continue
        registry.register(hook.target, guarded(hook), getattr(hook_type, hook.kind.upper()))


def markdown() -> str:
    """The table as docs/architecture.md shows it."""
    rows = [
        "| SGLang target | hook | kind | in a captured region | why it is safe there |",
        "| --- | --- | --- | --- | --- |",
    ]
    for hook in HOOKS:
        target = hook.target.removeprefix("sglang.srt.").removeprefix("sglang.")
        where = "yes" if hook.captured else "no" if hook.kind == "replace" else "no (guarded)"
        path = " (CPU path)" if hook.cpu_path else ""
        rows.append(
            f"| `{target}` | `{hook.hook.split(':')[1]}`{path} | {hook.kind} | {where} | "
            f"{hook.why} |"
        )
    return "\n".join(rows)


if __name__ == "__main__":
    print(markdown())
