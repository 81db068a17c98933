"""Differentially private description upload (FedTSP Sec. 3.5, Table 4) and an attack that
measures what it protects.

The mechanism (the paper's, the default): one chosen client, not the server, turns every
class prompt into its token-embedding sequence E in R^{n x d'} with the text encoder's
embedding layer g0, flattens E to a vector, clips it to L2 norm C and adds N(0, sigma^2 I)
with the Gaussian-mechanism scale

    sigma = 2 C sqrt(2 ln(1.25 / delta)) / epsilon

(sensitivity 2C: any two clipped vectors are at most 2C apart), and uploads the noisy
sequences once. The server builds the text prototypes (with its trainable prompts) from them.
Which positions are privatised: the real tokens of each prompt, except the slots that the
server's context vectors overwrite anyway (sent as zeros: they reach no feature); padding
holds the public pad token. The sequence lengths travel in clear, as they must for the
server to run the encoder; the paper does not discuss this. In a run the upload is FedTSP's
set-up message from client ``dp_client`` (``fedtsp.algorithms.fedtsp``).

The authors' code differs (an option, ``add_fixed_noise``): there the *server* adds one
Gaussian tensor of a set standard deviation, drawn once, to the frozen token embeddings of
every prompt, without clipping; that gives no (epsilon, delta) guarantee against the server.

The attack (``class_name_recovery``) asks how much of the class names an honest-but-curious
server can read back from the noisy upload of the handcrafted prompt "A photo of a {class}.":

* ``token``: at each position of the class-name tokens, the vocabulary token whose embedding
  has the highest cosine similarity with the noisy embedding (cosine, because clipping
  rescales the whole sequence); a class counts as recovered when all its tokens are.
* ``prompt``: the attacker knows the candidate labels (the dataset's label set) and the
  template, clips each candidate's clean sequence the same way, and picks the candidate of
  the same length nearest in L2 to the noisy upload (the maximum-likelihood guess under
  Gaussian noise). Its chance level is 1 / (number of candidates of that length).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "add_fixed_noise",
    "check_dp_parameters",
    "class_name_recovery",
    "clip_l2",
    "dp_sigma",
    "gaussian_mechanism",
    "privatize_sequences",
]


def check_dp_parameters(epsilon: float, delta: float, clip: float) -> None:
    """Raise ValueError unless epsilon > 0, 0 < delta < 1 and clip > 0."""
    if not (isinstance(epsilon, (int, float)) and math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"dp_epsilon={epsilon!r} is invalid; the privacy budget must be > 0")
    if not (isinstance(delta, (int, float)) and 0 < delta < 1):
        raise ValueError(f"dp_delta={delta!r} is invalid; it must lie strictly between 0 and 1")
    if not (isinstance(clip, (int, float)) and math.isfinite(clip) and clip > 0):
        raise ValueError(f"dp_clip={clip!r} is invalid; the clipping norm C must be > 0")


def dp_sigma(epsilon: float, delta: float, clip: float) -> float:
    """Gaussian-mechanism noise scale 2C sqrt(2 ln(1.25/delta)) / epsilon (L2 sensitivity 2C)."""
    check_dp_parameters(epsilon, delta, clip)
    return 2.0 * clip * math.sqrt(2.0 * math.log(1.25 / delta)) / epsilon


def clip_l2(vectors: Tensor, clip: float) -> Tensor:
    """Scale each row down to L2 norm at most ``clip`` (rows already inside are unchanged)."""
    norms = vectors.norm(dim=-1, keepdim=True)
    return vectors * (clip / norms.clamp_min(1e-12)).clamp(max=1.0)


def gaussian_mechanism(
    vectors: Tensor,
    epsilon: float | None,
    delta: float,
    clip: float,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Clip each row to norm ``clip``, then add N(0, dp_sigma(...)^2) to every coordinate.

    ``epsilon=None`` clips without noise (the attack's no-privacy reference). The noise is
    drawn on the CPU from ``generator`` so that it is the same on every device.
    """
    clipped = clip_l2(vectors.float(), clip)
    if epsilon is None:
        return clipped
    sigma = dp_sigma(epsilon, delta, clip)
    noise = torch.randn(clipped.shape, generator=generator, dtype=torch.float32)
    return clipped + sigma * noise.to(clipped.device)


def privatize_sequences(
    embeds: Tensor,
    keep: Tensor,
    epsilon: float | None,
    delta: float,
    clip: float,
    generator: torch.Generator | None = None,
) -> Tensor:
    """The client's upload: each sequence's ``keep`` positions flattened, clipped and noised.

    ``embeds`` is (P, L, d') token embeddings, ``keep`` a (P, L) bool mask of the positions
    that belong to the uploaded sequence. Returns a copy of ``embeds`` with those positions
    replaced by their privatised values; the other positions are unchanged.
    """
    if embeds.dim() != 3 or keep.shape != embeds.shape[:2]:
        raise ValueError(
            f"expected embeddings (P, L, d') and a (P, L) mask, got {tuple(embeds.shape)} "
            f"and {tuple(keep.shape)}"
        )
    out = embeds.detach().float().clone()
    keep = keep.bool()
    for p in range(out.shape[0]):
        flat = out[p][keep[p]].reshape(1, -1)
        noisy = gaussian_mechanism(flat, epsilon, delta, clip, generator)
        out[p][keep[p]] = noisy.reshape(-1, out.shape[2])
    return out.to(embeds.dtype)


def add_fixed_noise(embeds: Tensor, std: float, generator: torch.Generator | None = None) -> Tensor:
    """The authors' code variant: one N(0, std^2) tensor, drawn once, added; no clipping."""
    if not std >= 0:
        raise ValueError(f"dp_noise_std={std!r} is invalid; the standard deviation must be >= 0")
    noise = torch.randn(embeds.shape, generator=generator, dtype=torch.float32)
    return (embeds.float() + std * noise.to(embeds.device)).to(embeds.dtype)


# ---- the attack ------------------------------------------------------------------------------
def _vocabulary(encoder: Any) -> Tensor:
    """The encoder's token-embedding table (V, d'): BERT-style or open_clip text tower."""
    if hasattr(encoder, "model") and hasattr(encoder.model, "get_input_embeddings"):
        return encoder.model.get_input_embeddings().weight.detach()
    return encoder.token_embedding.weight.detach()


def _name_positions(prompt_ids: list[int], name_ids: list[int]) -> list[int]:
    for start in range(len(prompt_ids) - len(name_ids) + 1):
        if prompt_ids[start : start + len(name_ids)] == name_ids:
            return list(range(start, start + len(name_ids)))
    raise ValueError(f"class-name tokens {name_ids} not found in prompt tokens {prompt_ids}")


@torch.no_grad()
def class_name_recovery(
    encoder: Any,
    class_names: Sequence[str],
    epsilons: Sequence[float | None],
    *,
    delta: float = 1e-5,
    clip: float = 2.5,
    template: str = "A photo of a {}.",
    trials: int = 3,
    seed: int = 0,
) -> list[dict[str, float | None]]:
    """How often an attacker recovers each class name from its privatised prompt upload.

    For each epsilon (None: clipping only, no noise) returns a row with ``sigma``,
    ``token_recovery`` and ``prompt_recovery`` (fractions of classes x trials recovered;
    see the module docstring for the two attacks) and ``prompt_chance`` (the prompt
    attack's chance level). Each trial draws fresh noise from a generator seeded by
    (seed, epsilon index, trial).
    """
    check_dp_parameters(1.0, delta, clip)
    if trials < 1:
        raise ValueError(f"trials={trials} is invalid; need at least 1")
    names = list(class_names)
    prompts = [template.format(name) for name in names]
    ids, mask = encoder.tokenize(prompts)
    clean = encoder.embed_tokens(ids).float().cpu()  # (P, L, d')
    keep = mask.bool().cpu()
    lengths = keep.sum(1)
    id_lists = [ids[p, : int(lengths[p])].tolist() for p in range(len(names))]
    name_pos = []
    for p, name in enumerate(names):
        name_ids, name_mask = encoder.tokenize([name])
        name_ids = name_ids[0, 1 : int(name_mask.sum()) - 1].tolist()  # drop start/end tokens
        name_pos.append(_name_positions(id_lists[p], name_ids))

    vocab = F.normalize(_vocabulary(encoder).float().cpu(), dim=1)  # (V, d')
    # The prompt attack's candidates: every label's clean sequence, clipped like the upload.
    candidates = [clip_l2(clean[p][keep[p]].reshape(-1), clip) for p in range(len(names))]
    same_length = [
        [q for q in range(len(names)) if lengths[q] == lengths[p]] for p in range(len(names))
    ]
    chance = sum(1.0 / len(group) for group in same_length) / len(names)

    rows: list[dict[str, float | None]] = []
    for e_index, epsilon in enumerate(epsilons):
        token_hits = prompt_hits = 0
        for trial in range(trials):
            gen = torch.Generator().manual_seed(seed * 1_000_003 + e_index * 1_009 + trial)
            noisy = privatize_sequences(clean, keep, epsilon, delta, clip, gen)
            for p in range(len(names)):
                pos = name_pos[p]
                guess = (F.normalize(noisy[p, pos], dim=1) @ vocab.T).argmax(1)
                token_hits += int(guess.tolist() == [id_lists[p][i] for i in pos])
                upload = noisy[p][keep[p]].reshape(-1)
                group = same_length[p]
                dists = torch.stack([(upload - candidates[q]).norm() for q in group])
                prompt_hits += int(group[int(dists.argmin())] == p)
        total = trials * len(names)
        rows.append(
            {
                "epsilon": epsilon,
                "sigma": None if epsilon is None else dp_sigma(epsilon, delta, clip),
                "token_recovery": token_hits / total,
                "prompt_recovery": prompt_hits / total,
                "prompt_chance": chance,
            }
        )
    return rows
