"""The commented example scenario file (``pdopt simulate --example-config``): every key of the
format :meth:`pdopt.scenario.Scenario.from_toml` reads, with its default."""

EXAMPLE_CONFIG = """\
# pdopt simulate: one request-level simulation (pdopt simulate CONFIG.toml [--json]).
seed = 0                    # seeds the workload generator and the policy
tick_s = 0.05               # control tick Δt and time-series period, seconds
record_timeseries = true
engine = "auto"             # "python", "compiled" (numba; P/D workers, built-in routing
                            # policies) or "auto" (compiled when it runs, >= 20k requests)
# client_timeout_s = 60.0   # clients give up on a request not done after this (aborted)

[workload]
archetype = "production_mix"  # short_short, long_short, short_long, medium_medium, long_long,
                              # production_mix, alpaca, sharegpt, longbench
rate_per_s = 20.0             # open-loop mean arrival rate
n_requests = 2000
cv = 1.0                      # inter-arrival CV: 1 = Poisson, 3 = bursty
# trace = "traces/azure_code.csv"   # instead of an archetype: a trace file (format detected)
# format = "auto"                   # or azure, burstgpt, mooncake, vidur, splitwise_sim, csv, jsonl
# columns = { arrival_s = "ts", input_tokens = "prompt", output_tokens = "completion" }
#                                   # csv/jsonl with other names: the file's column for each
# time_unit = "s"                   # arrival unit of csv/jsonl: s, ms, us, ns or datetime
# arrival_kind = "time"             # or "gap": time since the previous request
# [workload.closed_loop]            # instead of open loop: N clients with think time
# clients = 32
# think_time_s = 1.0
# think = "constant"                # or "exponential" (mean think_time_s)
# start_spread_s = 0.0              # client i of N sends its first request at i * this / N

[cluster]
gpu = "A100-80GB"             # pdopt profile catalog lists GPUs and models
model = "Llama-2-7B"
tp = 1
profile = "roofline"          # "roofline" (synthetic prior) or a profile CSV path
n_prefill = 4
n_decode = 4
n_mixed = 0                   # Mixed-pool workers ...
mixed_pool_role = "mixed"     # ... "mixed": colocated (vllm, sarathi, ecoserve: n_prefill =
                              # n_decode = 0, n_mixed = N), or spares serving as "prefill" or
                              # "decode" until a policy moves them (phasor, splitwise, arrow)
link = "nvlink"               # nvlink, pcie4, 10gbe, 25gbe, 100gbe, kvpool
memory_utilization = 0.9      # KV per GPU = memory × this − weights − activation peak
# activation_peak_gib = 1.0     # instead of the estimated activation peak of a
                              # max_batch_tokens-token pass (pdopt.model_spec.kv_capacity)
# kv_capacity_blocks = 4000     # KV blocks per worker, given: replaces the formula above (then
                              # leave out memory_utilization and activation_peak_gib)
block_tokens = 16             # tokens per KV block
max_batch_tokens = 8192
max_batch_size = 64
max_running = 256
# vLLM's engine arguments may stand for pdopt's keys (not both): max_num_batched_tokens (also the
# colocated iteration budget), max_num_seqs (also max_batch_size), block_size,
# gpu_memory_utilization, num_gpu_blocks
# prefix_caching = true       # reuse the KV of prompt blocks already computed (workload blocks)
# server_overhead = "vllm_v1"   # the client's TTFT/E2E: + the serving stack's per-request time
                              # ("none", "vllm_v1", or { fixed_s, per_input_token_s,
                              # stream_iterations })
kv_allocation = "on_demand"   # decode KV: "on_demand" (grow per block) or "reserve_output"
                              # (reserve prompt + the request's own output at admission;
                              # the Python engine only)
preempted_requeue = "front"   # a preempted request rejoins its prefill queue at the "front"
                              # (vLLM, Sarathi-Serve) or the "back"
# max_context_tokens = "model"  # default: reject requests beyond the model's context window
                              # (an int: the deployment's window; "none": no check)

[policy]
name = "least_loaded"         # pdopt.policies.available_policies()
[policy.flags]                # keyword flags of the policy (ablations)

[slo]
ttft_s = 2.0
tpot_s = 0.1
"""
