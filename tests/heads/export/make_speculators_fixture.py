"""Write tests/heads/export/fixtures/speculators/: EAGLE-3 drafters saved by speculators' own code.

Run with the peer venv (../shared/peer/README.md: speculators 0.9.0), never by CI:

    ~/.cache/peer-venv/bin/python tests/heads/export/make_speculators_fixture.py

  verifier/       a tiny random Llama (4 layers, hidden 32, vocab 64), save_pretrained
  <variant>/      an Eagle3DraftModel built the way speculators' trainer builds one
                  (train/cli.py create_transformer_layer_config + from_training_args), every
                  tensor random, then save_pretrained
  <variant>/expected.safetensors
                  a fixed batch: token ids [1, T], the verifier's hidden states at the draft's
                  layer ids [1, T, 3h], and each TTT step's logits from speculators' own forward
                  [steps, 1, T - 1, draft_V], over speculators' alignment (token t + 1 with the
                  states of position t)

The verifier is named by the relative path "verifier" (the script runs in the fixture folder),
so the saved configs name no path of this machine.
"""

import os
from pathlib import Path

import torch
from safetensors.torch import save_file
from speculators.models.eagle3 import Eagle3DraftModel
from speculators.train.cli import create_transformer_layer_config
from transformers import LlamaConfig, LlamaForCausalLM

OUT = Path(__file__).parent / "fixtures" / "speculators"
VOCAB, DRAFT_VOCAB, SEQ, TTT_STEPS = 64, 48, 129, 3  # flex attention wants T - 1 a multiple of 128
LAYER_IDS = [1, 2, 3]  # speculators' ids: the INPUT of layers 1..3 (our output-of-layer 0..2)

# The trainer's defaults for eagle3 (train/config/schema.py): norm_before_residual, norm_before_fc
# and norm_output on, every draft layer sliding with a window of 2048.
VARIANTS = {
    "cli_defaults": dict(
        norm_before_residual=True, norm_before_fc=True, fc_norm=False, norm_output=True, sliding_window=2048
    ),
    # The other switches, and a window short enough to bite within SEQ tokens.
    "fc_norm_window": dict(
        norm_before_residual=False, norm_before_fc=False, fc_norm=True, norm_output=False, sliding_window=5
    ),
}


def write_verifier() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        initializer_range=0.2,  # sharp enough for greedy drafts to be accepted now and then
    )
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained("verifier")
    return model


def draft_vocab() -> tuple[torch.Tensor, torch.Tensor]:
    """t2d: every target id but 3 mod 4; d2t[d] = target id - d."""
    t2d = torch.arange(VOCAB) % 4 != 3
    d2t = torch.nonzero(t2d).squeeze(1) - torch.arange(DRAFT_VOCAB)
    return t2d, d2t


@torch.no_grad()
def write_variant(name: str, switches: dict, verifier: LlamaForCausalLM) -> None:
    layer_config = create_transformer_layer_config(
        verifier_name_or_path="verifier",
        num_layers=1,
        draft_arch="llama",
        hidden_act=None,
        sliding_window=switches["sliding_window"],
        full_attention_indices=[],
    )
    t2d, d2t = draft_vocab()
    torch.manual_seed(1)
    model = Eagle3DraftModel.from_training_args(
        verifier_config=layer_config,
        t2d=t2d,
        d2t=d2t,
        draft_vocab_size=DRAFT_VOCAB,
        ttt_steps=TTT_STEPS,
        verifier_name_or_path="verifier",
        target_layer_ids=LAYER_IDS,
        **{key: value for key, value in switches.items() if key != "sliding_window"},
    ).eval()
    generator = torch.Generator().manual_seed(2)
    for param_name, param in model.named_parameters():
        if param_name.startswith(("embed_tokens", "verifier_")):
            continue  # the verifier's own weights
        # Norms near one, everything else small: a trained-looking head where a swapped norm shows.
        offset = 1.0 if param_name.endswith("norm.weight") or ".fc_norm." in f".{param_name}" else 0.0
        param.copy_(offset + 0.2 * torch.randn(param.shape, generator=generator))
    model.save_pretrained(name)

    input_ids = torch.randint(0, VOCAB, (1, SEQ), generator=generator)
    states = verifier(input_ids, output_hidden_states=True).hidden_states  # [0] = embeddings
    aux = torch.cat([states[i] for i in LAYER_IDS], dim=-1)  # [1, T, 3h]
    logits = []
    hook = model.lm_head.register_forward_hook(lambda _module, _args, out: logits.append(out.clone()))
    model(
        hidden_states=aux[:, :-1],
        input_ids=input_ids[:, 1:],
        document_ids=torch.zeros(1, SEQ - 1, dtype=torch.long),
        ttt_steps=TTT_STEPS,
    )
    hook.remove()
    save_file(
        {"input_ids": input_ids, "aux_hidden_states": aux.contiguous(), "logits": torch.stack(logits)},
        str(Path(name) / "expected.safetensors"),
    )


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    os.chdir(OUT)
    verifier = write_verifier()
    for name, switches in VARIANTS.items():
        write_variant(name, switches, verifier)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
