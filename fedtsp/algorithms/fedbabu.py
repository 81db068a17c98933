"""FedBABU (Oh et al., "FedBABU: Toward Enhanced Representation for Federated Image
Classification", ICLR 2022): FedAvg of the body only, with the head frozen at its random
initialisation during federated training.

Every client starts from the same model (client 0's initial weights), so every client's
head is the same random head, and it never changes: it is neither trained (it is left out of
the local optimiser) nor sent. The GFL accuracy is that of the averaged body with the frozen
head; FedBABU-FT (``fedtsp.algorithms.finetune``) then fine-tunes the head per client, the
paper's personalisation step. The paper fine-tunes the whole model for the personalised
evaluation; following the homogeneous protocol of the FedTSP paper ("-FT": only the
classifier), the "-FT" variant fine-tunes the head only.
"""

from __future__ import annotations

from typing import Any

from fedtsp.algorithms.averaging import FedAvgClient, FedAvgServer
from fedtsp.algorithms.base import Algorithm, register
from fedtsp.algorithms.clients import Client
from fedtsp.algorithms.finetune import FineTuned, FineTuneOptions, HeadFineTuning
from fedtsp.algorithms.model_messages import HEAD_PREFIX


class FedBABUClient(FedAvgClient):
    def shares(self, key: str) -> bool:
        return not key.startswith(HEAD_PREFIX)

    def client_parameters(self, client: Client) -> list[Any]:
        return list(client.model.features.parameters())


FedBABU = register(Algorithm("fedbabu", FedBABUClient, FedAvgServer, settings=("gfl",)))


class FedBABUFTClient(HeadFineTuning, FedBABUClient):
    State = FineTuned


# FedBABU, then each client fine-tunes the frozen random head (the paper's personalisation, restricted to the head).
FedBABUFT = register(
    Algorithm("fedbabu-ft", FedBABUFTClient, FedAvgServer, FineTuneOptions, settings=("pfl",))
)
