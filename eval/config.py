"""What the eval runs: the typed `eval.*` settings (a leaf module: the job's schema, eval/run.py
and the export tool read it without importing the runner)."""

from dataclasses import dataclass, field


@dataclass
class EvalConfig:
    # Packaged names (mt_bench, humaneval, gsm8k) or paths to JSONL prompt sets.
    tasks: list[str] = field(default_factory=lambda: ["mt_bench", "humaneval", "gsm8k"])
    # Prompts per task; null = all. Small values give a quick but noisy AL.
    prompts_per_task: int | None = 8
    max_new_tokens: int = 64
    # chain | tree (EAGLE heads; Medusa heads always use their static tree).
    mode: str = "chain"
    # Chain: drafts per round (the maximum, under an adaptive policy). Tree: depth. Block drafter
    # (dflash): the most slots of each drafted block verified (at most its block_size - 1); it
    # takes policy static or draft_prob (which verifies the prefix the chain probability keeps).
    draft_length: int = 4
    # static: always draft_length; draft_prob: EAGLE-2's stop rule (chain probability below
    # policy_threshold ends the round); confidence: the confidence head's survival below
    # policy_threshold ends it (trees keep the nodes of highest survival); expected_gain:
    # draft while the next token's survival pays its measured cost (alpha, beta), and verify
    # only the drafts whose survival pays for verifying them (none: a plain step); ngram: prompt
    # lookup, no head (eval/drafting/ngram.py: what followed the text's last 3..1 tokens earlier), e.g. as
    # eval.compare=[ngram:8] beside the head on the same turns; hybrid_<policy> (e.g. hybrid_static,
    # hybrid_expected_gain): the n-gram draft in rounds where the text matches, the head's chain
    # under <policy> otherwise (eval/drafting/hybrid.py).
    policy: str = "static"
    policy_threshold: float = 0.3
    # confidence / expected_gain: the step size of the online log-odds correction of the
    # confidence head's c (eval/policies.py, RunningCorrection), learnt from what verification
    # reveals, request after request; 0 turns it off. Larger: a head whose confidence is off
    # on this data (no eval.calibration fit, another temperature) is corrected in fewer rounds.
    adapt_rate: float = 0.05
    # More chain settings "policy:K" (e.g. static:2, draft_prob:8) decoded on the same turns,
    # interleaved with the main one and the baselines; each gets its own per-task summary
    # (report["compare"]), so one run ranks them on equal terms.
    compare: list[str] = field(default_factory=list)
    # Confidence heads: measure calibration on real decoding (false: skip it, keep the trained
    # temperatures, and save the decoding it costs: e.g. when only AL and speed are wanted).
    calibration: bool = True
    # Confidence heads: prompts per task (disjoint from the evaluated ones) whose real decoding
    # fits the per-position temperatures; the evaluated prompts then report ECE/AUROC/Brier.
    # The head with those temperatures goes to <out>/calibrated_head (the trained head directory
    # is never written); export ships it. 0 = keep the temperatures fitted at training time.
    calibration_prompts_per_task: int = 2
    # Confidence heads: further held-out prompts per task to report the calibration on (more
    # rounds than the evaluated prompts give: on a few hundred rounds even a perfectly calibrated
    # head scores an ECE of a few hundredths). 0 = report on the evaluated prompts.
    calibration_report_prompts_per_task: int = 0
    # Tree drafting: top-k expansion per depth and total node budget.
    tree_top_k: int = 4
    tree_budget: int = 12
    # Sampled chains: token (Leviathan et al., each draft judged alone) or block (Sun et al. 2025:
    # the chain judged as a whole, never fewer accepted drafts in expectation, same output
    # distribution). Greedy decoding and trees are unaffected.
    verification: str = "token"
    # 0 = greedy. top_p / top_k are applied identically to target and draft. Above 0, greedy
    # identity (eval/verdict.py) is checked on an extra greedy pass of the same setting per turn.
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    # Time the plain loop and HF generate (greedy + prompt lookup) on the same prompts. Off, the
    # plain loop and HF greedy still decode every turn, untimed: the verdict's identity check.
    baselines: bool = True
    # On a CUDA target: replay decode, verify and draft steps as CUDA graphs (eval/cuda_graphs.py).
    # Ignored on CPU.
    cuda_graphs: bool = True
    # How the target's Linear layers run (heads/target.py, CachedTarget): auto (prepacked for
    # oneDNN on a CPU in fp32), torch (the modules as they are) or compiled (decode steps,
    # verifications and an EAGLE head's draft steps through torch.compile with frozen weights,
    # heads/compiled.py: minutes of compilation per process on a CPU, then cheaper steps and
    # cheaper verification; BENCHMARKS.md, sessions 15-16).
    # The plain loop and the speculative decoder always share it, so speed-ups stay fair.
    target_linears: str = "auto"
    seed: int = 0
