"""Prompt data: download, assembly with reward masks, stratified sampler, embedding cache.

Public API: `load_table(path) -> DataFrame`, `records(df) -> list[PromptRecord]`,
`PromptRecord`, `prompt_id`, `DataError`, `reward_masks(df)`; the sampler is
`marble.data.sampler.StratifiedKRepeatSampler`, the cache `marble.data.embed_cache.EmbeddingCache`.
"""

from marble.data.records import (
    DataError,
    PromptRecord,
    load_table,
    mask_column,
    prompt_id,
    records,
    reward_masks,
)

__all__ = ["DataError", "PromptRecord", "load_table", "mask_column", "prompt_id", "records", "reward_masks"]
