"""FedAvg (McMahan et al., "Communication-Efficient Learning of Deep Networks from
Decentralized Data", AISTATS 2017): every client trains the whole model, the server averages
all weights, sample-weighted, and every client continues from the average.

Model-homogeneous settings only (``gfl``). All clients start from one model (the server's
first broadcast is client 0's initial weights, as a FedAvg server sends its global model in
round 0). The floating-point state is averaged, BatchNorm running statistics included, with
the one rule every averaging method shares (``fedtsp.algorithms.aggregation.fedavg``); BatchNorm's
integer batch counter stays local.

A model travels as ``"model.<state key>"`` entries (``fedtsp.algorithms.model_messages``).
"""

from __future__ import annotations

from fedtsp.algorithms.averaging import FedAvgClient, FedAvgServer
from fedtsp.algorithms.base import Algorithm, register
from fedtsp.algorithms.finetune import FineTuned, FineTuneOptions, HeadFineTuning

FedAvg = register(Algorithm("fedavg", FedAvgClient, FedAvgServer, settings=("gfl",)))


class FedAvgFTClient(HeadFineTuning, FedAvgClient):
    State = FineTuned


# FedAvg, then each client fine-tunes the global model's head (FedAvg-FT).
FedAvgFT = register(
    Algorithm("fedavg-ft", FedAvgFTClient, FedAvgServer, FineTuneOptions, settings=("pfl",))
)
