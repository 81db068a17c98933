"""The "-FT" personalisation of the model-homogeneous PFL setting (Table 3), which FedAvg-FT,
FedBABU-FT, FedFA-FT, FedTSP-FT and FedETF-Per add to their base method's client half (each
registered in its base method's file).

A "-FT" method trains exactly as its base method does (the same uploads, server step and
broadcast). Before each evaluation every client takes the global model it holds, fine-tunes
*only the classifier* on its own train split for ``ft_epochs`` epochs (SGD, ``ft_lr``,
batches of ``ft_batch_size``; the body frozen, in eval mode, so its features are computed once)
and is evaluated on its own test split through that fine-tuned head. The fine-tuned head is a
copy: it never flows back into federated training, so the global model, and therefore the
GFL run of the same method, is unaffected. Its randomness (the batch order) is fixed by
(seed, round, client), so the evaluation is reproducible and a resumed run repeats it exactly.

PFL accuracy = the record's ``acc`` (sample-weighted over the clients' test splits), and its
summary's ``best_pfl_acc``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from fedtsp.algorithms.base import ClientHalf
from fedtsp.algorithms.clients import Client
from fedtsp.core.options import option

_FT_TAG = 0xF7


@dataclass
class FineTuneOptions:
    ft_epochs: int = option(
        5, "epochs of head-only fine-tuning before each evaluation (-FT/-Per)", ">= 0"
    )
    ft_lr: float = option(0.01, "SGD learning rate of the head fine-tuning", "> 0")
    ft_batch_size: int = option(100, "batch size of the head fine-tuning", ">= 1")


@dataclass
class FineTuned:
    """A "-FT" client's state adds the head it fine-tuned for the coming evaluation
    (recomputed at every evaluation; checkpointed with the rest of the state)."""

    ft_head: tuple[Tensor, Tensor] | None = None


class HeadFineTuning(ClientHalf):
    """Client-half mixin (put it first; its State must include ``FineTuned``): fine-tune a
    copy of the head before each evaluation.

    Subclasses may override ``ft_features`` (what the head reads) and ``ft_initial_head``
    (where fine-tuning starts); the defaults are the model's features and its own head.
    """

    def ft_features(self, client: Client, x: Tensor) -> Tensor:
        return client.model.features(x)

    def ft_initial_head(self, client: Client) -> tuple[Tensor, Tensor]:
        head = client.model.head
        return head.weight.detach().float(), head.bias.detach().float()

    def prepare_evaluation(self, client: Client, round_index: int) -> None:
        client.model.eval()
        with torch.no_grad(), client.autocast():
            feats = torch.cat(
                [
                    self.ft_features(client, client.train_x[lo : lo + 1000]).float()
                    for lo in range(0, client.num_train, 1000)
                ]
            )
        weight, bias = (t.clone().requires_grad_(True) for t in self.ft_initial_head(client))
        optimizer = torch.optim.SGD([weight, bias], lr=self.opts.ft_lr)
        seed = np.random.SeedSequence([self.ctx.seed, round_index, client.index, _FT_TAG])
        generator = torch.Generator().manual_seed(int(seed.generate_state(1)[0]))
        for _ in range(self.opts.ft_epochs):
            for idx in client.batches(self.opts.ft_batch_size, generator):
                loss = F.cross_entropy(F.linear(feats[idx], weight, bias), client.train_y[idx])
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
        client.state.ft_head = (weight.detach(), bias.detach())

    def predict(self, client: Client, x: Tensor) -> Tensor:
        weight, bias = client.state.ft_head
        return F.linear(self.ft_features(client, x).float(), weight, bias)
