"""Target layer ids: our convention and each engine's, in one table.

Ours (docs/ARCHITECTURE.md): id i = the OUTPUT of decoder layer i, before the final norm
(Hugging Face's `hidden_states[i + 1]`; the SpecForge/ModelOpt convention).

What each engine does with the ids written in a drafter's config, as checked in the code of
the released packages (pip wheels, November 2026):

  sglang       0.5.23  `eagle_config.eagle_aux_hidden_state_layer_ids` is read by
               srt/model_executor/model_runner_components/spec_aux_hidden_state.py and
               handed to `set_eagle3_layers_to_capture` (srt/models/llama.py), which adds 1
               ("for the ith layer, it takes the output of the (i-1)th layer") and captures
               the INPUT of layer id + 1: the output of layer id. Offset 0.
               Without ids it captures the input of [2, n // 2, n - 3].
  vllm         0.33.0  top-level `eagle_aux_hidden_state_layer_ids` (else
               `eagle_config.eagle_aux_hidden_state_layer_ids`, same meaning) is read by
               v1/worker/gpu_model_runner.py `_get_eagle3_aux_layers_from_config` and used
               as is; model_executor/models/interfaces.py `_maybe_add_hidden_state` stores
               index j after layer j - 1 (j = 0: the embeddings), i.e. the INPUT of layer j.
               Offset +1. Default (2, n // 2, n - 3).
  speculators  0.9.0   `eagle_aux_hidden_state_layer_ids` is passed to vLLM unchanged
               (vllm transformers_utils/configs/speculators/algos.py) and speculators'
               own models/utils.py `resolve_target_layer_ids` uses the same meaning (ids in
               [0, n], default [2, n // 2, n - 3]). Offset +1.

So on a 30-layer target our default [1, 14, 26] is [1, 14, 26] for SGLang and [2, 15, 27]
for vLLM and speculators, and every engine's default names the same three tensors.
"""

from collections.abc import Sequence

# engine id = our id + offset
ENGINE_LAYER_ID_OFFSET = {
    "sglang": 0,
    "vllm": 1,
    "speculators": 1,
}


def _offset(engine: str) -> int:
    if engine not in ENGINE_LAYER_ID_OFFSET:
        raise ValueError(f"unknown engine {engine!r} for layer ids (known: {sorted(ENGINE_LAYER_ID_OFFSET)})")
    return ENGINE_LAYER_ID_OFFSET[engine]


def to_engine_layer_ids(layer_ids: Sequence[int], engine: str) -> list[int]:
    """Our output-of-layer ids -> the ids `engine` expects in a drafter config."""
    return [int(i) + _offset(engine) for i in layer_ids]


def from_engine_layer_ids(layer_ids: Sequence[int], engine: str, num_layers: int) -> list[int]:
    """Ids read from an `engine` drafter config -> ours; an id we cannot capture is an error.

    vLLM's id 0 (the embeddings) has no output-of-layer equivalent.
    """
    ours = [int(i) - _offset(engine) for i in layer_ids]
    bad = [engine_id for engine_id, i in zip(layer_ids, ours) if not 0 <= i < num_layers]
    if bad:
        raise ValueError(
            f"{engine} layer ids {list(layer_ids)}: {bad} name no decoder-layer output of a "
            f"{num_layers}-layer target (valid {engine} ids: {_offset(engine)}..{num_layers - 1 + _offset(engine)})"
        )
    return ours


def engine_default_layer_ids(engine: str, num_layers: int) -> list[int]:
    """What `engine` captures when the drafter config names no ids, in OUR convention.

    All three capture the inputs of layers [2, n // 2, n - 3] (see the module docstring).
    """
    _offset(engine)
    return [i - 1 for i in (2, num_layers // 2, num_layers - 3)]
