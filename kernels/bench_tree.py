"""Tree-kernel cases of kernels/bench.py: tree verification (greedy, sampling, sampling with
top-k / top-p) and tree attention metadata, each against its torch reference and the floor.

Verification rounds are planted so that every request accepts the whole depth (the first child
of each node on one path is the target's pick, with the draft equal to the target there): the
longest walk, and the floor counts exactly the rows it must read, the target logits (and draft
probabilities) of the depth + 1 nodes on the path and, sampling, the race's V uniforms.
"""

from dataclasses import dataclass

import torch

from kernels.bench_timing import Row, time_per_call
from kernels.registry import kernel
from kernels.tree_metadata_reference import tree_metadata_reference
from kernels.tree_verify_reference import draw_uniforms, processed_probs

SAMPLINGS = {  # name -> (temperature, top_k, top_p)
    "greedy": (0.0, 0, 1.0),
    "T=1": (1.0, 0, 1.0),
    "T=0.7 top-k 50 top-p 0.9": (0.7, 50, 0.9),
}


@dataclass(frozen=True)
class TreeSizes:
    vocab: int
    nodes: int  # per tree, root included
    depth: int
    batches: tuple[int, ...]  # requests per call
    kv_len: int  # metadata: attention mask columns
    warmup: int
    iters: int


GPU_TREE_SIZES = TreeSizes(vocab=128256, nodes=61, depth=6, batches=(1, 8), kv_len=4096, warmup=3, iters=10)
DRY_RUN_TREE_SIZES = TreeSizes(vocab=129, nodes=12, depth=3, batches=(1, 3), kv_len=40, warmup=1, iters=2)


def _parents(batch: int, sizes: TreeSizes, generator: torch.Generator, device) -> torch.Tensor:
    """[B, N]: nodes 1..depth form a chain (each the first child of the one before), the others
    hang under random earlier nodes less than depth deep."""
    rows = []
    for _ in range(batch):
        parents, depths = [-1], [0]
        for node in range(1, sizes.nodes):
            if node <= sizes.depth:
                parent = node - 1
            else:
                shallow = [other for other in range(node) if depths[other] < sizes.depth]
                parent = shallow[int(torch.randint(len(shallow), (1,), generator=generator))]
            parents.append(parent)
            depths.append(depths[parent] + 1)
        rows.append(parents)
    return torch.tensor(rows, device=device)


def planted_round(batch: int, sizes: TreeSizes, sampling: tuple, device, dtype) -> tuple:
    """The arguments of one "tree_verify" call whose every request accepts the whole depth."""
    generator = torch.Generator().manual_seed(batch)
    parents = _parents(batch, sizes, generator, device)
    zeros = torch.zeros(batch, dtype=torch.long, device=device)
    most_children = int(torch.bincount(parents[parents >= 0]).max())
    children = tree_metadata_reference(parents, zeros, sizes.nodes, sizes.depth, most_children).children
    target_logits = (torch.randn(batch, sizes.nodes, sizes.vocab, generator=generator) * 2).to(device, dtype)
    tokens = torch.randint(sizes.vocab, (batch, sizes.nodes), generator=generator).to(device)
    chain = torch.arange(1, sizes.depth + 1, device=device)
    tokens[:, chain] = target_logits[:, chain - 1].argmax(dim=-1)  # the target's pick at each parent
    temperature, top_k, top_p = sampling
    if temperature == 0:
        return children, tokens, target_logits, None, None, sizes.depth, *sampling
    noise = torch.randn(target_logits.shape, generator=generator).to(device)
    draft_probs = processed_probs(target_logits.float() + noise, temperature, top_k, top_p)
    draft_probs[:, : sizes.depth] = processed_probs(
        target_logits[:, : sizes.depth], temperature, top_k, top_p
    )
    uniforms = draw_uniforms(batch, sizes.nodes, sizes.vocab, device=device)
    return children, tokens, target_logits, draft_probs, uniforms, sizes.depth, *sampling


def verify_rows(
    batch: int, device, dtype, sizes: TreeSizes, impls: list[str], bandwidth: float, sampling_name: str
) -> list[Row]:
    sampling = SAMPLINGS[sampling_name]
    args = planted_round(batch, sizes, sampling, device, dtype)
    logit_bytes = torch.finfo(dtype).bits // 8
    row_bytes = logit_bytes if sampling[0] == 0 else logit_bytes + 4  # + the draft row (fp32)
    moved = batch * ((sizes.depth + 1) * sizes.vocab * row_bytes + (sampling[0] > 0) * sizes.vocab * 4)
    shape = f"B={batch} N={sizes.nodes} D={sizes.depth} V={sizes.vocab} {sampling_name}"
    rows, outputs = [], {}
    for impl in impls:
        verify = kernel("tree_verify", device, impl)
        outputs[impl] = verify(*args)
        check = "reference"
        if impl != "reference":
            same = all(torch.equal(a, b) for a, b in zip(outputs[impl], outputs["reference"]))
            check = "identical" if same else "MISMATCH"
        if int(outputs[impl].accept_len.min()) != sizes.depth:
            check += f"; accepted {outputs[impl].accept_len.tolist()} of {sizes.depth} (planted)"
        seconds = time_per_call(lambda verify=verify: verify(*args), device, sizes.warmup, sizes.iters)
        rows.append(Row("tree_verify", shape, impl, seconds, moved / bandwidth, check))
    return rows


def metadata_rows(
    batch: int, device, dtype, sizes: TreeSizes, impls: list[str], bandwidth: float
) -> list[Row]:
    generator = torch.Generator().manual_seed(batch)
    parents = _parents(batch, sizes, generator, device)
    prefix_lens = torch.randint(sizes.kv_len - sizes.nodes, (batch,), generator=generator).to(device)
    most_children = int(torch.bincount(parents[parents >= 0]).max())
    args = (parents, prefix_lens, sizes.kv_len, sizes.depth, most_children)
    moved = (
        batch * sizes.nodes * (sizes.kv_len + 8 * (2 + most_children))
    )  # mask, positions, children, parents
    shape = f"B={batch} N={sizes.nodes} D={sizes.depth} kv_len={sizes.kv_len}"
    rows, outputs = [], {}
    for impl in impls:
        metadata = kernel("tree_metadata", device, impl)
        outputs[impl] = metadata(*args)
        check = "reference"
        if impl != "reference":
            same = all(torch.equal(a, b) for a, b in zip(outputs[impl], outputs["reference"]))
            check = "identical" if same else "MISMATCH"
        seconds = time_per_call(lambda metadata=metadata: metadata(*args), device, sizes.warmup, sizes.iters)
        rows.append(Row("tree_metadata", shape, impl, seconds, moved / bandwidth, check))
    return rows
