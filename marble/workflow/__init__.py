"""The workflow's logic as pure functions of the config: the `.smk` files only bind
`config` and call these (Snakemake keeps validation, constants and thin input functions).

- `slurm`: SLURM resources of a job (partition, account, gres, nodes/tasks, requeue signal).
- `runs`: a configured run's `marble train` overrides, arguments and final checkpoint.
- `checkpoints`: which checkpoints evaluation knows (configured runs, scanned folders,
  named folders and hub LoRAs) and their labels.
- `evaluation`: the evaluation settings folder name, the launcher and `marble evaluate` arguments.

Every function takes plain dicts (the validated config sections) and returns plain values, so
`tests/test_workflow_logic.py` tests them without Snakemake.
"""
