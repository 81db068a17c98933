#!/usr/bin/env bash
# CPU-scale comparison of the twelve methods of Table 1 (Local, FedProto, FedTSP and the nine
# heterogeneous baselines), all in the same setting:
# CIFAR-10 (offline JPEG archive), Dir(0.1), 20 clients, 0.25 stratified fraction,
# family htfe-cpu, 40 rounds of 1 local epoch, seeds 0 and 1, one CPU thread per run.
# Records go to ./runs; the summary table to comparison.md.
set -euo pipefail
cd "$(dirname "$0")"
DATA=${FEDTSP_DATA:-../../../shared/data/cifar10-jpg.tar.gz}
for seed in 0 1; do
  for algo in local fedproto fedtsp fedtgp alignfed fedgh fedgen lg-fedavg fml feddistill fedkd fedmrl; do
    OMP_NUM_THREADS=1 fedtsp run --dataset cifar10 --data "$DATA" --alpha 0.1 --num-clients 20 --fraction 0.25 \
      --family htfe-cpu --algorithm "$algo" --rounds 40 --local-epochs 1 --seed "$seed" \
      --out runs --no-progress --resume
  done
done
python -m fedtsp.paper.report runs --group algorithm > comparison.md
cat comparison.md
