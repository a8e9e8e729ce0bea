"""Evaluate a head: acceptance length per task with the built-in decoder, and wall-clock
time per token against plain decoding, HF greedy `generate` and HF prompt lookup, all
measured in one run (warm-up first, methods interleaved per request).

    python eval/run.py head_dir=outputs/eagle3/head out=outputs/eval [eval=full] [eval.key=value ...]
    python eval/run.py head_dir=... out=... --cfg job      # print the resolved config

Hydra, under the job's schema (conf/eval_run.yaml: the same `target` and `eval` groups), so
`eval.*` means here what it means in the job's eval stage (`train/run.py`), which calls
`evaluate` with the same settings; both end with
the closing summary (eval/summary.py). The head directory is only read: temperatures fitted on
real decoding go to `<out>/calibrated_head`.
Multi-turn prompts (MT-bench) replay earlier turns with the target's own answers.
Beside report.json goes verdict.json (eval/verdict.py), what export trusts: the evaluated
head's digest, the drafting setting, AL per task, and greedy identity against the plain loop and
HF `generate` on every turn, whatever eval.baselines says (at T > 0, a greedy pass for it).
"""

import dataclasses
import json
import logging
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import hydra
import torch
from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf
from tqdm.auto import tqdm

from data.chat_template import generation_prompt_ids
from data.eval_sets import EvalPrompt, load_eval_set
from eval.baselines import hf_generate
from eval.calibration import evaluate_calibration
from eval.config import EvalConfig
from eval.decoder import (
    COST_CONTEXTS,
    BlockDrafting,
    ChainDrafting,
    HybridDrafting,
    MedusaTreeDrafting,
    NgramDrafting,
    SpeculativeDecoder,
    TreeDrafting,
)
from eval.policies import (
    MAX_DRAFT_LEN,
    ConfidenceThreshold,
    DraftProbabilityThreshold,
    StaticDraftLength,
    expected_gain_from_costs,
)
from eval.report import Record, build_report, write_report
from eval.summary import closing_summary, next_command
from eval.verdict import VERDICT_FILE, IdentityCheck, Verdict, write_verdict
from eval.verify import SamplingParams
from heads.confidence import load_confidence
from heads.machine import describe_machine
from heads.registry import head_digest, load_head, read_head_config
from heads.target import TARGET_LINEARS, Target, TargetConfig, dtype_name

log = logging.getLogger(__name__)

CALIBRATED_HEAD = "calibrated_head"  # in the eval's out dir
PROMPT_LOOKUP_TOKENS = 10  # HF's prompt-lookup n-gram draft length (SPEC.md §7 reference)
HYBRID = "hybrid_"  # eval.policy=hybrid_<policy>: n-gram drafts where they match, the head's otherwise
SPECULATIVE, PLAIN, HF_GREEDY, HF_LOOKUP = "speculative", "plain", "hf_greedy", "hf_prompt_lookup"


def load_trained_head(target: Target, head_dir: Path) -> torch.nn.Module:
    target.check_head_dir(head_dir)
    head = load_head(
        head_dir,
        embed_weight=target.embed_weight,
        lm_head_weight=target.lm_head_weight,
        target_config=target.config,
    )
    return head.to(device=target.device, dtype=target.dtype).eval()


def make_decoder(
    target: Target, head, kind: str, cfg: EvalConfig, max_len: int, confidence=None, costs: dict | None = None
) -> SpeculativeDecoder:
    policies = {
        "static": lambda: StaticDraftLength(cfg.draft_length),
        "draft_prob": lambda: DraftProbabilityThreshold(cfg.draft_length, cfg.policy_threshold),
        "confidence": lambda: ConfidenceThreshold(cfg.draft_length, cfg.policy_threshold, cfg.adapt_rate),
        "expected_gain": lambda: expected_gain_from_costs(cfg.draft_length, costs, cfg.adapt_rate),
    }
    if cfg.policy == "ngram":  # prompt lookup: no head, no confidence
        head, confidence, drafting = None, None, NgramDrafting(draft_length=cfg.draft_length)
    elif kind == "medusa":
        drafting = MedusaTreeDrafting()
        confidence = None  # the static Medusa tree does not use it
    elif kind == "dflash":
        if cfg.policy not in ("static", "draft_prob") or cfg.mode != "chain":
            raise ValueError(
                f"eval.policy={cfg.policy!r}, eval.mode={cfg.mode!r}: a block drafter (dflash) drafts its "
                "block in one forward and verifies a prefix of it as a chain: eval.mode=chain with "
                "eval.policy=static or draft_prob (or ngram, prompt lookup beside it)"
            )
        drafting = BlockDrafting(policies[cfg.policy]())
    elif cfg.mode == "tree":
        drafting = TreeDrafting(
            depth=cfg.draft_length,
            top_k=cfg.tree_top_k,
            budget=cfg.tree_budget,
            by_confidence=cfg.policy == "confidence",
        )
    elif cfg.mode == "chain":
        policy, hybrid = cfg.policy, cfg.policy.startswith(HYBRID)
        if hybrid:  # the n-gram draft where the text matches, the head's chain under `policy` otherwise
            policy = policy.removeprefix(HYBRID)
        if policy not in policies:
            raise ValueError(
                f"eval.policy={cfg.policy!r}; choose one of {sorted(policies)}, ngram, "
                f"or {HYBRID}<policy> (e.g. {HYBRID}static)"
            )
        drafting = ChainDrafting(policies[policy]())
        if hybrid:
            drafting = HybridDrafting(drafting, NgramDrafting(draft_length=cfg.draft_length))
    else:
        raise ValueError(f"eval.mode={cfg.mode!r}; choose chain or tree")
    return SpeculativeDecoder(
        target.model,
        head,
        drafting,
        max_len,
        eos_token_id=target.tokenizer.eos_token_id,
        confidence=confidence,
        cuda_graphs=cfg.cuda_graphs,
        verification=cfg.verification,
        linears=cfg.target_linears,
    )


def calibrate(
    target: Target,
    head,
    kind: str,
    confidence,
    cfg: EvalConfig,
    prompts: list[EvalPrompt],
    max_len: int,
    out_dir: Path,
) -> dict:
    """Fit the confidence temperatures on real decoding of prompts the eval does not use, then
    report per-position ECE/AUROC/Brier of the survival on the evaluated prompts, or on further
    held-out ones (calibration_report_prompts_per_task). First turns only."""
    static = dataclasses.replace(cfg, mode="chain", policy="static")
    decoder = make_decoder(target, head, kind, static, max_len, confidence)
    fit_count, report_count = cfg.calibration_prompts_per_task, cfg.calibration_report_prompts_per_task

    def first_turns(chosen: list[EvalPrompt]) -> list[list[int]]:
        return [encode_turn(target, [], p.turns[0]) for p in chosen]

    fit, held_out = [], []
    if fit_count or report_count:
        for task in cfg.tasks:
            every = load_eval_set(task)
            evaluated = min(cfg.prompts_per_task or len(every), len(every))
            extra = every[evaluated : evaluated + fit_count + report_count]
            if len(extra) < fit_count + report_count:
                raise ValueError(
                    f"eval set {task!r} has {len(every)} prompts: too few for {evaluated} evaluated "
                    f"+ eval.calibration_prompts_per_task={fit_count} + eval.calibration_report_prompts_per_task="
                    f"{report_count} disjoint ones (lower them, or eval.prompts_per_task)"
                )
            fit += first_turns(extra[:fit_count])
            held_out += first_turns(extra[fit_count:])
    report_ids = held_out or first_turns(prompts)
    sampling = SamplingParams(cfg.temperature, cfg.top_k, cfg.top_p)
    generator = torch.Generator(device=target.device).manual_seed(cfg.seed + 1)
    return evaluate_calibration(decoder, fit, report_ids, cfg.max_new_tokens, out_dir, sampling, generator)


def write_calibrated_head(head_dir: Path, confidence, out_dir: Path) -> Path:
    """A copy of the trained head whose confidence head carries the temperatures fitted on real
    decoding. The trained head directory stays as training wrote it, so an eval changes nothing
    that keys a rerun (the head's hash) and two evals never fight over one file."""
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(head_dir, tmp)
    confidence.save_pretrained(tmp)
    tmp.rename(out_dir)
    return out_dir


def encode_turn(target: Target, history: list[dict], turn: str) -> list[int]:
    return generation_prompt_ids(target.tokenizer, history + [{"role": "user", "content": turn}])


def parse_setting(text: str) -> tuple[str, int]:
    """'policy:K' (e.g. static:4, draft_prob:8, confidence:8) -> (policy, K)."""
    policy, _, length = text.partition(":")
    if not length.isdigit():
        raise ValueError(f"drafting setting {text!r}: expected policy:K, e.g. static:4")
    return policy, int(length)


class Runner:
    """Runs every method on one turn, in an order that rotates between turns.

    decoders: the speculative decoders by name (SPECULATIVE for the main one, "policy:K" for
    eval.compare); the plain loop is the main decoder's."""

    def __init__(self, target: Target, decoders: dict[str, SpeculativeDecoder], cfg: EvalConfig):
        self.target, self.decoders, self.cfg = target, decoders, cfg
        self.sampling = SamplingParams(cfg.temperature, cfg.top_k, cfg.top_p)
        self.generator = torch.Generator(device=target.device).manual_seed(cfg.seed)
        self.methods = list(decoders) + ([PLAIN, HF_GREEDY, HF_LOOKUP] if cfg.baselines else [])
        self.turns_run = 0

    def _run(
        self, method: str, prompt_ids: list[int], sampling: SamplingParams | None = None
    ) -> tuple[list[int], float, object]:
        """One method on one turn, sampled as the eval is unless `sampling` says otherwise."""
        sampling = sampling or self.sampling
        start = time.perf_counter()
        if method in self.decoders:
            out = self.decoders[method].generate(
                prompt_ids, self.cfg.max_new_tokens, sampling, self.generator
            )
            return out.tokens, time.perf_counter() - start, out.metrics
        if method == PLAIN:
            out = self.decoders[SPECULATIVE].generate_plain(
                prompt_ids, self.cfg.max_new_tokens, sampling, self.generator
            )
            return out.tokens, time.perf_counter() - start, None
        lookup = PROMPT_LOOKUP_TOKENS if method == HF_LOOKUP else 0
        tokens, seconds = hf_generate(
            self.target.model,
            torch.tensor([prompt_ids], device=self.target.device),
            self.cfg.max_new_tokens,
            self.target.tokenizer.eos_token_id,
            prompt_lookup_tokens=lookup,
            sampling=sampling,
        )
        return tokens, seconds, None

    def greedy_outputs(self, prompt_ids: list[int], tokens: dict[str, list[int]]) -> dict[str, list[int]]:
        """Greedy outputs of the decoders and of both references (PLAIN, HF_GREEDY) on one turn.

        Greedy runs check their own outputs (every setting); sampled runs check a greedy pass of
        the main setting. A reference the timed run lacks (eval.baselines=false) or sampled is
        decoded here, untimed: the check never depends on what was timed."""
        greedy = SamplingParams()
        if self.sampling.greedy:
            outputs = {name: tokens[name] for name in self.decoders}
        else:
            outputs = {SPECULATIVE: self._run(SPECULATIVE, prompt_ids, greedy)[0]}
        for reference in (PLAIN, HF_GREEDY):
            reused = self.sampling.greedy and reference in tokens
            outputs[reference] = tokens[reference] if reused else self._run(reference, prompt_ids, greedy)[0]
        return outputs

    def turn(self, prompt_ids: list[int]) -> tuple[dict[str, list[int]], dict[str, float], dict[str, object]]:
        """-> tokens and seconds per method, decode metrics per speculative decoder."""
        shift = self.turns_run % len(self.methods)
        order = self.methods[shift:] + self.methods[:shift]
        tokens, seconds, metrics = {}, {}, {}
        for method in order:
            tokens[method], seconds[method], m = self._run(method, prompt_ids)
            if m is not None:
                metrics[method] = m
        self.turns_run += 1
        return tokens, seconds, metrics


COST_CONTEXT_ROOM = max(COST_CONTEXTS) + MAX_DRAFT_LEN + 2  # a cost decoder's max_len
COST_HEADLINE_CONTEXT = 256  # the context whose costs price expected_gain and the overall verdict


@torch.no_grad()
def measure_costs(decoder: SpeculativeDecoder) -> dict:
    """The decoder's measured costs (SpeculativeDecoder.measure_costs) at the headline context,
    with every context bucket's under "buckets" (the report's per-bucket verdicts read those)."""
    buckets = decoder.measure_costs()
    headline = min(buckets, key=lambda context: abs(int(context) - COST_HEADLINE_CONTEXT))
    return {**buckets[headline], "buckets": buckets}


def evaluate(
    target: Target,
    head_dir: Path,
    cfg: EvalConfig,
    out_dir: Path,
    log_fn: Callable[[dict], None] | None = None,
) -> Path:
    """Run the eval; write report.json/.md, records.jsonl and plots to out_dir; return the JSON path."""
    if cfg.target_linears not in TARGET_LINEARS:
        raise ValueError(f"eval.target_linears={cfg.target_linears!r}: choose one of {TARGET_LINEARS}")
    if cfg.target_linears == "compiled" and target.device.type == "cpu" and target.dtype != torch.float32:
        raise ValueError(
            f"eval.target_linears=compiled with a {dtype_name(target.dtype)} target on a "
            "CPU: the compiled forward scores a verification's tokens unlike their decode steps in reduced "
            "precision (BENCHMARKS.md, session 27), so greedy output would leave the plain loop's; use "
            "eval.target_linears=auto (in bf16 on a CPU with native bf16 a verification costs ~1-1.4 steps there)"
        )
    head = load_trained_head(target, head_dir)
    kind = read_head_config(head_dir)["kind"]
    confidence = load_confidence(head_dir, embed_weight=target.embed_weight)
    if confidence is not None:
        confidence = confidence.to(device=target.device, dtype=target.dtype).eval()
    if cfg.policy in ("confidence", "expected_gain") and (confidence is None or kind == "medusa"):
        raise ValueError(f"eval.policy={cfg.policy!r} needs an EAGLE head trained with head.confidence=true")
    if cfg.compare and (kind == "medusa" or cfg.mode != "chain"):
        raise ValueError("eval.compare lists chain settings: it needs eval.mode=chain and an EAGLE head")
    variants = {SPECULATIVE: cfg}  # the drafting settings decoded on every turn, by name
    for setting in cfg.compare:
        policy, length = parse_setting(setting)
        variants[setting] = dataclasses.replace(cfg, policy=policy, draft_length=length)
    prompts: list[EvalPrompt] = [p for task in cfg.tasks for p in load_eval_set(task, cfg.prompts_per_task)]
    longest = max(len(encode_turn(target, [], " ".join(p.turns))) for p in prompts)
    max_len = longest + cfg.max_new_tokens * (1 + max(len(p.turns) for p in prompts)) + 16
    # Calibrate and price drafts as deep as the deepest setting drafts.
    deepest = max(variant.draft_length for variant in variants.values())
    calibration, calibrated_dir = None, out_dir / CALIBRATED_HEAD
    shutil.rmtree(calibrated_dir, ignore_errors=True)  # a previous eval's, fitted on other settings
    if confidence is not None and kind != "medusa" and cfg.calibration:
        calibration = calibrate(
            target,
            head,
            kind,
            confidence,
            dataclasses.replace(cfg, draft_length=deepest),
            prompts,
            max_len,
            out_dir / "calibration",
        )
        if cfg.calibration_prompts_per_task:
            write_calibrated_head(head_dir, confidence, calibrated_dir)
    costs = None
    if kind != "medusa":
        static = dataclasses.replace(cfg, policy="static", draft_length=deepest)
        # Long enough to time every context bucket the target allows, whatever the eval's prompts need.
        cost_len = min(max(max_len, COST_CONTEXT_ROOM), target.config.max_position_embeddings)
        costs = measure_costs(make_decoder(target, head, kind, static, cost_len))
    decoders = {
        name: make_decoder(target, head, kind, variant, max_len, confidence, costs)
        for name, variant in variants.items()
    }
    runner = Runner(target, decoders, cfg)
    runner.turn(encode_turn(target, [], "Say hello."))  # warm-up of every method

    records: dict[str, list[Record]] = {name: [] for name in decoders}
    baselines = [m for m in runner.methods if m not in decoders]
    mismatches = {PLAIN: 0, HF_GREEDY: 0}
    hf_is_reference = target.dtype == torch.float32
    turns = sum(len(p.turns) for p in prompts)
    with tqdm(total=turns, desc=f"eval ({', '.join(cfg.tasks)})") as bar:
        for prompt in prompts:
            history: list[dict] = []
            for index, turn in enumerate(prompt.turns):
                prompt_ids = encode_turn(target, history, turn)
                tokens, seconds, metrics = runner.turn(prompt_ids)
                outputs = runner.greedy_outputs(prompt_ids, tokens)
                where = f"{prompt.task}/{prompt.id} turn {index}"
                for reference, count in identity_mismatches(outputs, where, hf_is_reference).items():
                    mismatches[reference] += count
                for name, decoded in metrics.items():
                    # Each setting's record reads its own time as the speculative one.
                    own = {SPECULATIVE: name} | {m: m for m in baselines}
                    records[name].append(
                        turn_record(prompt, index, len(prompt_ids), decoded, tokens, seconds, own)
                    )
                reference = tokens.get(PLAIN, tokens[SPECULATIVE])
                answer = target.tokenizer.decode(reference, skip_special_tokens=True)
                history += [{"role": "user", "content": turn}, {"role": "assistant", "content": answer}]
                bar.update(1)
    methods = [SPECULATIVE, *baselines]
    report = build_report(records[SPECULATIVE], methods, costs)
    report["compare"] = {
        setting: {
            key: value
            for key, value in build_report(records[setting], methods, costs).items()
            if key != "costs"
        }
        for setting in cfg.compare
    }
    report["calibration"] = calibration
    report["settings"] = dataclasses.asdict(cfg)
    report["machine"] = describe_machine()  # every time and cost above is this machine's
    report["target_dtype"] = dtype_name(target.dtype)
    report["head"] = {
        "dir": str(head_dir),
        "kind": kind,
        # The head as evaluated (temperatures fitted on real decoding): what export ships.
        "calibrated_dir": str(calibrated_dir) if calibrated_dir.is_dir() else None,
    }
    identity = IdentityCheck(
        turns,
        mismatches[PLAIN],
        mismatches[HF_GREEDY],
        greedy_pass=not runner.sampling.greedy,
        hf_is_reference=hf_is_reference,
    )
    report["identity"] = dataclasses.asdict(identity)
    report["greedy_mismatches"], report["greedy_checked_turns"] = identity.mismatches, identity.turns
    path = write_report(report, records[SPECULATIVE], out_dir)
    evaluated_dir = calibrated_dir if calibrated_dir.is_dir() else head_dir
    write_verdict(
        make_verdict(
            report, head_dir, evaluated_dir, drafting_setting(decoders[SPECULATIVE], cfg, kind), identity
        ),
        out_dir,
    )
    if log_fn is not None:
        log_fn(json.loads(path.read_text()))
    if identity.mismatches:
        raise RuntimeError(
            f"greedy output {identity.describe()}: the decoder is not lossless here "
            f"(the log names the turns; the verdict in {out_dir} refuses export)"
        )
    return path


def turn_record(
    prompt: EvalPrompt,
    index: int,
    prompt_tokens: int,
    decoded,
    tokens: dict[str, list[int]],
    seconds: dict[str, float],
    methods: dict[str, str],
) -> Record:
    """One setting's record of one turn; methods: report name -> the run whose tokens and time it reads."""
    return Record(
        task=prompt.task,
        category=prompt.category,
        id=prompt.id,
        turn=index,
        prompt_tokens=prompt_tokens,
        response_tokens=len(tokens[methods[SPECULATIVE]]),
        proposed_tokens=decoded.proposed_tokens,
        accepted_draft_tokens=decoded.accepted_draft_tokens,
        emitted_tokens=decoded.emitted_tokens,
        verification_rounds=decoded.verification_rounds,
        accepted_by_position=decoded.accepted_per_position,
        proposed_by_position=decoded.proposed_per_position,
        drafted_by_position=decoded.drafted_per_position,
        seconds={method: seconds[run] for method, run in methods.items()},
        tokens_by_method={method: len(tokens[run]) for method, run in methods.items()},
    )


def identity_mismatches(outputs: dict[str, list[int]], where: str, hf_is_reference: bool) -> dict[str, int]:
    """Per reference (PLAIN, HF_GREEDY): how many decoders' greedy outputs differ from it, each
    logged (as an error against a reference; IdentityCheck.hf_is_reference)."""
    decoded = [name for name in outputs if name not in (PLAIN, HF_GREEDY)]
    counts = {}
    for reference in (PLAIN, HF_GREEDY):
        differ = [name for name in decoded if outputs[name] != outputs[reference]]
        level = logging.ERROR if reference == PLAIN or hf_is_reference else logging.INFO
        for name in differ:
            log.log(level, "%s: %s greedy output differs from %s", where, name, reference)
        counts[reference] = len(differ)
    return counts


def drafting_setting(decoder: SpeculativeDecoder, cfg: EvalConfig, kind: str) -> dict:
    """The main decoder's drafting, as its setting describes itself, with the sampling and
    verification rule: what a verdict and a card quote."""
    drafting = decoder.drafting.describe()
    if drafting["drafter"] in ("chain", "tree"):
        drafting["drafter"] = f"{kind} {drafting['drafter']}"
    if cfg.temperature == 0:
        return drafting | {"temperature": 0.0, "verification": "greedy (argmax)"}
    tree = isinstance(decoder.drafting, TreeDrafting | MedusaTreeDrafting)
    rule = "recursive rejection sampling" if tree else f"{cfg.verification}-wise"
    return drafting | {
        "temperature": cfg.temperature,
        "top_k": cfg.top_k,
        "top_p": cfg.top_p,
        "verification": rule,
    }


def make_verdict(
    report: dict, trained_dir: Path, evaluated_dir: Path, drafting: dict, identity: IdentityCheck
) -> Verdict:
    """The verdict on the head as evaluated (the calibrated copy when the eval wrote one)."""
    costs, tasks = report["costs"], report["task"]
    as_drafted = bool(costs) and all(summary["priced_as_drafted"] for summary in tasks.values())
    return Verdict(
        head_dir=str(evaluated_dir),
        head_sha256=head_digest(evaluated_dir),
        trained_head_sha256=head_digest(trained_dir),
        head_kind=report["head"]["kind"],
        drafting=drafting,
        acceptance_length={task: summary["acceptance_length"] for task, summary in tasks.items()},
        overall_acceptance_length=report["overall"]["acceptance_length"],
        break_even_acceptance_length=costs["break_even_acceptance_length"] if costs else None,
        identity=identity,
        break_even_by_task={task: summary["break_even_acceptance_length"] for task, summary in tasks.items()}
        if as_drafted
        else None,
    )


@dataclass
class EvalRunConfig:
    """`python eval/run.py`'s schema: the job's `target` and `eval` groups, a head and an out dir."""

    head_dir: str = MISSING  # a trained head's directory (only read)
    out: str = MISSING  # where the report, plots and calibrated_head go
    target: TargetConfig = field(default_factory=TargetConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)


def register_configs() -> None:
    """Make `eval_run_schema` (the first entry of conf/eval_run.yaml's defaults) type every group."""
    ConfigStore.instance().store(name="eval_run_schema", node=EvalRunConfig)


def run_eval(run: EvalRunConfig) -> Path:
    """Evaluate run.head_dir into run.out and print the closing summary; -> report.json's path."""
    target = Target.load(run.target)
    path = evaluate(target, Path(run.head_dir), run.eval, Path(run.out))
    report = json.loads(path.read_text())
    export = export_command(report, run.target.name, path)
    print(closing_summary(report, path, next_command(report, None, export)), flush=True)
    return path


register_configs()


@hydra.main(config_path="../conf", config_name="eval_run", version_base="1.3")
def main(cfg: DictConfig) -> None:
    run_eval(OmegaConf.to_object(cfg))


def export_command(report: dict, target_name: str, report_path: Path) -> str:
    """The export tool's command for the head as evaluated, gated on the verdict beside this report."""
    from heads.export.formats import formats_for

    head = report["head"]["calibrated_dir"] or report["head"]["dir"]
    fmt = formats_for(report["head"]["kind"])[0]
    out = Path(report_path).parent / "export" / fmt
    return (
        f"python -m heads.export --head {head} --target {target_name} --format {fmt} "
        f"--out {out} --verdict {Path(report_path).with_name(VERDICT_FILE)}"
    )


if __name__ == "__main__":
    main()
