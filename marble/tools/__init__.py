"""Tools around the pipeline, never imported by training or evaluation: benchmarks (`bench*`),
the one-GPU check (`gpu_check`), the report (`report`), the dev mirror and paper-mini (`dev`)."""
