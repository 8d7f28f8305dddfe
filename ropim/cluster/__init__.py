"""The servers ropim starts beside its jobs: the local Ray head + MLflow server of ``make cluster-up``
(``python -m ropim.cluster``), and the MLflow basic-auth setup that it shares with ``ray_cluster.yaml``'s head
(``python -m ropim.cluster.mlflow_auth``). Programs are started as programs: nothing here imports torch, Ray or
MLflow."""
