"""The catalogue `make mutants` runs (marble/tools/mutants.py): meaningful bugs of the core,
each with the tests that must catch it.

Snippets are short, stable lines; each must occur exactly once in its file (the runner and
tests/test_mutants.py fail naming the entry otherwise). When code moves, move the entry
with it: same bug, new file or snippet; never drop it to make the list pass.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mutant:
    """One bug: replace `original` (exactly once in `file`) by `replacement`; `tests` must fail."""

    name: str
    file: str  # relative to the tree root
    original: str
    replacement: str
    tests: tuple[str, ...]  # pytest node ids or test files
    why: str = ""  # the bug it stands for


_TRAINER = "marble/training/trainer.py"
_RESUME_TEST = "tests/test_trainer.py::test_resume_is_bitwise"

MUTANTS: list[Mutant] = [
    # ---------------------------------------------------------------- resume, checkpoints
    Mutant("resume_skips_ema", _TRAINER,
           'self.ema.load_state_dict(state["ema"])', "None",
           (_RESUME_TEST,),
           "resume leaves the weight EMA at its fresh init: the lora/ evaluation loads differs"),
    Mutant("resume_skips_balancer_state", _TRAINER,
           'self.balancer.load_state_dict(state["balancer"])', "None",
           (_RESUME_TEST,),
           "resume forgets the alpha cache: the next solve restarts the EMA"),
    Mutant("checkpoint_without_complete_marker_used", "marble/training/checkpoint_format.py",
           "if step is not None and child.is_dir() and (child / COMPLETE).is_file():",
           "if step is not None and child.is_dir():",
           ("tests/test_checkpoint.py::test_incomplete_checkpoints_are_ignored",
            "tests/test_checkpoint.py::test_a_run_whose_only_checkpoint_is_half_written_starts_over"),
           "a half-written checkpoint folder (no COMPLETE) counts as a checkpoint: a run killed in "
           "its first save refuses to resume instead of starting over"),
    Mutant("checkpoint_hashes_unchecked", "marble/training/checkpoint_format.py",
           "elif sha256_file(path) != digest:", "elif False:",
           ("tests/test_checkpoint.py::test_damaged_newest_checkpoint_falls_back_with_a_warning",),
           "a truncated / bit-rotted checkpoint file passes as intact"),
    # ---------------------------------------------------------------- the NFT maths
    Mutant("forward_sigma_swapped", "marble/maths/flow.py",
           "return (1.0 - sb) * x0 + sb * eps", "return sb * x0 + (1.0 - sb) * eps",
           ("tests/test_microstep.py::test_forward_process_by_hand_per_sample", "tests/test_flow.py::test_forward_process_by_hand"),
           "x_t = sigma x0 + (1 - sigma) eps: the other flow convention"),
    Mutant("kl_against_old_policy", "marble/training/microstep.py",
           "kl_loss(v_theta, v_ref)", "kl_loss(v_theta, v_old)",
           ("tests/test_microstep.py::test_lora_gradient_equals_hand_built_nft_plus_kl",),
           "the KL term pulls towards the old policy instead of the frozen base"),
    Mutant("nft_negative_policy_sign", "marble/maths/nft.py",
           "v_neg = (1.0 + beta) * v_old - beta * v_theta",
           "v_neg = (1.0 - beta) * v_old + beta * v_theta",
           ("tests/test_nft.py",),
           "the implicit negative policy v- mirrors v+ the wrong way"),
    Mutant("nft_weight_floor_raised", "marble/maths/nft.py",
           "WEIGHT_FLOOR = 1e-5", "WEIGHT_FLOOR = 1e-3",
           ("tests/test_nft.py::test_nft_weights_are_floored",),
           "the adaptive weight's clamp differs from the reference's 1e-5"),
    Mutant("optimality_prob_scale", "marble/maths/nft.py",
           "return (adv.clamp(-c, c) / (2 * c) + 0.5).clamp(0.0, 1.0)",
           "return (adv.clamp(-c, c) / c + 0.5).clamp(0.0, 1.0)",
           ("tests/test_nft.py::test_optimality_prob_clips_and_maps",),
           "r = A / C + 1/2 saturates at |A| = C/2"),
    Mutant("amortized_mean_over_all_rows", "marble/maths/nft.py",
           "coef = valid.double() * (a / counts)", "coef = valid.double() * (a / b)",
           ("tests/test_nft.py::test_one_evaluation_equals_k_evaluations",),
           "exact masking divides by the batch instead of the reward's applicable rows"),
    # ---------------------------------------------------------------- advantages, masks
    Mutant("advantage_global_mean", "marble/maths/advantages.py",
           "adv = (cols - group_mean[gid]) / (col_std + eps)",
           "adv = (cols - col_mean) / (col_std + eps)",
           ("tests/test_advantages.py",),
           "advantages centred on the column mean, not the prompt's group"),
    Mutant("advantage_mask_read_as_zero", "marble/maths/advantages.py",
           'adv = torch.where(valid, adv, torch.full_like(adv, float("nan")))',
           "adv = torch.where(valid, adv, torch.zeros_like(adv))",
           ("tests/test_advantages.py",),
           "a reward that does not apply gets advantage 0 instead of NaN (a silent zero)"),
    # ---------------------------------------------------------------- balancers, schedules
    Mutant("qp_tie_tolerance", "marble/maths/qp.py",
           "_OBJ_RTOL = 1e-10", "_OBJ_RTOL = 1e-3",
           ("tests/test_balance.py::test_a_near_tie_is_not_a_tie",),
           "near-ties (4e-4 apart) are traded for a smaller-norm, worse alpha"),
    Mutant("alpha_cache_rho_swapped", "marble/maths/ema.py",
           "return rho * old + (1.0 - rho) * new", "return (1.0 - rho) * old + rho * new",
           ("tests/test_ema.py::test_alpha_cache_ema_by_hand",),
           "the alpha EMA weighs the new solve by rho"),
    Mutant("weight_ema_uncapped", "marble/maths/ema.py",
           "return min((1.0 + step) / (10.0 + step), float(max_decay))",
           "return (1.0 + step) / (10.0 + step)",
           ("tests/test_ema.py::test_ema_decay_schedule",),
           "the weight-EMA decay exceeds ema_decay late in training"),
    Mutant("old_decay_cap_dropped", _TRAINER,
           "self.cfg.train.old_decay_cap)", "0.5)",
           ("tests/test_trainer.py::test_tiny_training_each_balancer[weighted_sum]",),
           "the trainer ignores train.old_decay_cap (the function's default 0.5 applies)"),
    Mutant("marble_amortize_off_by_one", "marble/balancers/strategies.py",
           "return step.global_step - self.last_full >= self.cfg.amortize_every",
           "return step.global_step - self.last_full > self.cfg.amortize_every",
           ("tests/test_balancers.py::test_marble_schedule_and_alpha_ema_by_hand",),
           "full solves every amortize_every + 1 steps"),
    Mutant("euler_step_reversed", "marble/models/sampling.py",
           "return z + (sigma_next - sigma) * v", "return z + (sigma - sigma_next) * v",
           ("tests/test_sampling.py::test_euler_step_by_hand",),
           "the Euler step integrates the flow ODE backwards"),
    Mutant("dpm2_correction_sign", "marble/models/sampling.py",
           "return a, b * (1.0 + inv_2r), -b * inv_2r", "return a, b * (1.0 - inv_2r), b * inv_2r",
           ("tests/test_sampling.py::test_dpm2_coefficients_by_hand",),
           "DPM-Solver++(2M)'s second-order correction with the wrong sign"),
    # ---------------------------------------------------------------- sampler
    Mutant("sampler_no_shuffle", "marble/data/sampler.py",
           "shuffled = repeated[rng.permutation(len(repeated))]", "shuffled = repeated",
           ("tests/test_data_sampler.py::test_the_k_copies_of_a_prompt_spread_over_ranks_as_a_uniform_shuffle",),
           "the k copies of a prompt stay together on one rank"),
    Mutant("sampler_remainder_to_last", "marble/data/sampler.py",
           "return [base + (1 if i < rest else 0) for i in range(n_sources)]",
           "return [base + (1 if i >= n_sources - rest else 0) for i in range(n_sources)]",
           ("tests/test_data_sampler.py::test_per_source_counts_gives_remainder_to_first_sources",),
           "the remainder prompts go to the last sorted sources"),
    Mutant("sampler_seed_plus_epoch", "marble/data/sampler.py",
           "return stable_seed(int(seed), STREAM_PROMPT_PLAN, int(epoch))",
           "return int(seed) + int(epoch)",
           ("tests/test_data_sampler.py::test_keyed_plans_of_seeds_0_to_15_over_epochs_0_to_9_are_pairwise_different",),
           "the keyed default falls back to the reference's seed + epoch: seed s + 1 replays seed s"),
    # ---------------------------------------------------------------- rewards' rules
    Mutant("geneval_position_corners", "marble/rewards/geneval_rules.py",
           "center_a, center_b = (a[:2] + a[2:]) / 2, (b[:2] + b[2:]) / 2",
           "center_a, center_b = a[:2], b[:2]",
           ("tests/test_rewards_geneval.py::test_relative_position_uses_box_centres_not_corners",),
           "the position rule compares top-left corners, not centres"),
    Mutant("geneval_counting_threshold", "marble/rewards/geneval_rules.py",
           'threshold = COUNTING_THRESHOLD if tag == "counting" else THRESHOLD',
           "threshold = THRESHOLD",
           ("tests/test_rewards_geneval.py::test_select_objects_thresholds_order_and_cap",),
           "counting prompts keep detections above 0.3 instead of 0.9"),
    Mutant("geneval_count_credit_binary", "marble/rewards/geneval_rules.py",
           "credits.append(1 - abs(n_req - len(found)) / n_req)",
           "credits.append(float(len(found) == n_req))",
           ("tests/test_rewards_geneval.py::test_single_object_and_negative_count_credit",),
           "the partial count credit becomes all-or-nothing"),
    Mutant("reward_applies_to_ignored", "marble/rewards/base.py",
           'return (metadata or {}).get("source") in self.applies_to',
           "return self.applies_by_content(prompt, metadata or {})",
           ("tests/test_rewards_toy.py::test_applies_to_overrides_content_rule",),
           "a reward's configured applies_to (source list) is ignored: the mask comes from content"),
    Mutant("reward_scores_inapplicable_rows", "marble/rewards/base.py",
           "idx = [i for i, (p, m) in enumerate(zip(prompts, metadata)) if self.applies(p, m)]",
           "idx = list(range(len(prompts)))",
           ("tests/test_rewards_toy.py::test_color_match_mask_and_values",),
           "rows a reward does not apply to are scored instead of NaN"),
    Mutant("ocr_last_quoted_span", "marble/rewards/base.py",
           "for match in _QUOTED.finditer(prompt):",
           "for match in reversed(list(_QUOTED.finditer(prompt))):",
           ("tests/test_rewards_ocr.py::test_default_target_rule_is_the_first_non_empty_quoted_span",),
           "the OCR target is the last quoted span"),
    # ---------------------------------------------------------------- dev replicas (the mirror)
    Mutant("bert_replica_vocab_keyword", "marble/tools/dev/replicas.py",
           'BertTokenizer(str(folder / "vocab.txt"), do_lower_case=True)',
           'BertTokenizer(vocab_file=str(folder / "vocab.txt"), do_lower_case=True)',
           ("tests/test_replicas.py::test_bert_replica_tokenizes_words",),
           "the old bug: transformers 5 ignores vocab_file=, every word becomes [UNK]"),
    Mutant("clip_replica_vocab_keyword", "marble/tools/dev/replicas.py",
           'CLIPTokenizer(str(folder / "vocab.json"), str(folder / "merges.txt"), model_max_length=77)',
           'CLIPTokenizer(vocab_file=str(folder / "vocab.json"), merges_file=str(folder / "merges.txt"),'
           " model_max_length=77)",
           ("tests/test_replicas.py::test_clip_replica_tokenizes_words",),
           "the same bug in the CLIP replicas (PickScore, CLIP-H, CLIP-L)"),
    # ---------------------------------------------------------------- evaluation
    Mutant("eval_seed_ignores_repeat", "marble/evaluation/prompts.py",
           "return stable_seed(int(global_seed), str(prompt_id), int(repeat))",
           "return stable_seed(int(global_seed), str(prompt_id))",
           ("tests/test_evaluate_units.py::test_sample_seed_is_deterministic_and_distinct",),
           "repeats of a prompt get the same initial noise"),
    Mutant("geneval_overall_sample_mean", "marble/evaluation/results.py",
           'out["geneval_overall"] = _mean(tag_acc) if len(tag_acc) == len(GENEVAL_TAGS) else float("nan")',
           'out["geneval_overall"] = out.get("accuracy", float("nan"))',
           ("tests/test_evaluate_units.py::test_geneval_summary_official_overall_is_mean_of_tag_accuracies",),
           "GenEval overall is the sample mean, not the mean of the six tag accuracies"),
    Mutant("composite_sample_std", "marble/evaluation/summary.py",
           "std = values.std(axis=0, ddof=0, skipna=True)",
           "std = values.std(axis=0, ddof=1, skipna=True)",
           ("tests/test_eval_summary.py::test_composite_reproduces_table1",),
           "the composite z-score uses the sample std (the page uses the population std)"),
]
