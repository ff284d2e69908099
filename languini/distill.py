"""Distillation: a finished run of any project teaches a model of any project (Switch Transformer, section 4; the
slides' "Distillation"). The student trains for a compute class on the teacher's data, stream for stream, with

    loss = hard_weight x cross-entropy(student, next token) + soft_weight x KL(teacher || student)

averaged over the target tokens (the slides mix 0.75 of the ground truth with 0.25 of the teacher's
probabilities; the KL differs from that mixture's cross-entropy by the teacher's entropy, a constant, so the
gradients are the same). The teacher runs in eval mode under no_grad, in the run's precision, its state carried
per stream when it is stateful, whole on every process of a multi-process run (also a teacher trained with its
experts or memory split over processes). Optionally the student starts from the teacher's weights wherever a
name and a shape agree (for switch_gpt -> gpt: every weight but the experts and their routers, the slides'
"non-expert weights"; a student's split tensor takes its part of the teacher's).

The teacher's forward costs accelerator time. Charged (the default), the class pays for it: with S the student's
training throughput (its throughput row, as for any run) and F the teacher's forward throughput on the same
reference hardware (EVAL_SPEEDUP = 3 x the teacher's training throughput, the plan's forward-to-step ratio, or
given), the run spends 1/S + 1/F seconds of the class per token, so it trains fewer steps than a plain run. Not
charged, it trains a plain run's steps; either way config.json and results.json record which, with the numbers.

The pieces: TeacherRun (a finished run folder), kl_to_teacher / distillation_loss, copy_matching_weights,
charged_tokens_per_second, gain_kept (the slides' "percent of teacher performance"), Distillation (the extension
of languini.experiment.run that scripts/distill.py passes) and DistillationTrainer (the trainer with the loss).
"""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from languini import aux_loss, checkpoint, model_contract, model_parallel, throughput
from languini.compute_class import compute_class_seconds, training_steps
from languini.plan import EVAL_SPEEDUP, Plan
from languini.run_folder import RESULTS
from languini.trainer import Trainer, detach

HARD_WEIGHT, SOFT_WEIGHT = 0.75, 0.25  # the slides' mixture


def kl_to_teacher(logits: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
    """KL(teacher || student) per target token, averaged over tokens, in float32: logits (..., vocab)."""
    log_p = F.log_softmax(logits.float().flatten(0, -2), dim=-1)
    log_q = F.log_softmax(teacher_logits.float().flatten(0, -2), dim=-1)
    return F.kl_div(log_p, log_q, reduction="batchmean", log_target=True)


def distillation_loss(logits: torch.Tensor, teacher_logits: torch.Tensor, targets: torch.Tensor,
                      hard_weight: float = HARD_WEIGHT, soft_weight: float = SOFT_WEIGHT) -> torch.Tensor:
    """hard_weight x cross-entropy + soft_weight x KL(teacher || student), both averaged over the target tokens;
    the trainer's objective (DistillationTrainer.objective) is this with the cross-entropy it computes anyway."""
    cross_entropy = F.cross_entropy(logits.float().flatten(0, -2), targets.flatten())
    return hard_weight * cross_entropy + soft_weight * kl_to_teacher(logits, teacher_logits)


def _whole_shape(tensor: torch.Tensor) -> tuple[int, ...]:
    """The shape of the whole tensor of which a student's tensor may hold this process's part (model_parallel)."""
    s = model_parallel.sharding(tensor)
    return s.full_shape if s else tuple(tensor.shape)


def matching_weights(student: torch.nn.Module, teacher_state: dict) -> list[str]:
    """The names of the student's state (parameters and persistent buffers) that the teacher's state_dict (whole
    tensors) holds with the same shape, a split tensor's whole shape: what init_from_teacher copies."""
    return [name for name, tensor in student.state_dict(keep_vars=True).items()  # keep_vars: the split is kept
            if name in teacher_state and tuple(teacher_state[name].shape) == _whole_shape(tensor)]


@torch.no_grad()
def copy_matching_weights(student: torch.nn.Module, teacher_state: dict) -> list[str]:
    """Copy the teacher's tensors into the student wherever a name and a shape agree, into a split tensor its
    part; the names copied."""
    names = matching_weights(student, teacher_state)
    state = student.state_dict(keep_vars=True)
    for name in names:
        s = model_parallel.sharding(state[name])
        state[name].copy_(model_parallel.local_part(teacher_state[name], s) if s else teacher_state[name])
    return names


def charged_tokens_per_second(student_training: float, teacher_forward: float) -> float:
    """Tokens per second of the class when each token costs a training step of the student and a forward pass
    of the teacher: 1 / (1/S + 1/F)."""
    return 1 / (1 / student_training + 1 / teacher_forward)


def gain_kept(teacher_eval: dict, baseline_eval: dict, student_eval: dict) -> dict:
    """The share of the teacher's gain over the baseline that the student keeps, per mode and split evaluated by
    all three with the same tokens scored: (log P_baseline - log P_student) / (log P_baseline - log P_teacher), P
    the normalised perplexity (the slides' "percent of teacher performance", on log perplexities). Each eval is
    results.json's "eval": {mode: {split: row}}."""
    kept = {}
    for mode, splits in student_eval.items():
        for split, row in splits.items():
            teacher, baseline = teacher_eval.get(mode, {}).get(split), baseline_eval.get(mode, {}).get(split)
            if teacher is None or baseline is None or not (
                    teacher["scored_tokens"] == baseline["scored_tokens"] == row["scored_tokens"]):
                continue  # not evaluated alike: no fraction
            base = math.log(baseline["normalised_perplexity"])
            gain = base - math.log(teacher["normalised_perplexity"])
            kept.setdefault(mode, {})[split] = {
                "teacher": teacher["normalised_perplexity"], "baseline": baseline["normalised_perplexity"],
                "student": row["normalised_perplexity"],
                "fraction_kept": (base - math.log(row["normalised_perplexity"])) / gain if gain else None}
    return kept


@dataclass(frozen=True)
class TeacherRun:
    """A finished run folder (its results.json and checkpoint) as a teacher."""

    run_dir: Path
    project: str
    config: str
    model_config: dict
    steps: int
    tokens_per_second: float | None  # the reference throughput its training was charged at
    reference_hardware: str
    dataset_fingerprint: str
    train_config: dict
    eval: dict

    @classmethod
    def load(cls, run_dir: str | Path) -> "TeacherRun":
        run_dir = Path(run_dir)
        path = run_dir / RESULTS
        if not path.exists():
            raise FileNotFoundError(f"{run_dir} holds no {RESULTS}: a teacher is a finished run of train.py (its "
                                    "results give its data, throughput and evaluation).")
        results = json.loads(path.read_text())
        if not checkpoint.exists(run_dir):
            raise FileNotFoundError(f"{run_dir} holds no {checkpoint.CHECKPOINT}: the teacher's weights are missing.")
        return cls(run_dir.resolve(), results["project"], results["config"], results["model_config"],
                   results["steps"], results.get("tokens_per_second"), results["reference_hardware"],
                   results["dataset_fingerprint"], results["train_config"], results.get("eval", {}))

    def state_dict(self) -> dict:
        """The teacher's weights from its checkpoint (on the CPU, whole tensors: the parts of a split checkpoint
        merged), which must be of its last step."""
        ckpt, _ = checkpoint.load(self.run_dir, torch.device("cpu"))
        if ckpt["step"] != self.steps:
            raise ValueError(f"The teacher's checkpoint in {self.run_dir} is of step {ckpt['step']}, its results of "
                             f"step {self.steps}: not the finished model.")
        if ckpt["model_config"] != self.model_config:
            raise ValueError(f"The teacher's checkpoint in {self.run_dir} holds another model than its results.")
        return ckpt["model"]


class Distillation:
    """What distillation adds to a run of languini.experiment (a RunExtension): the teacher's forward charged to
    the plan, a run-name tag, the record in config.json and results.json, and the trainer (`trainer`)."""

    def __init__(self, teacher: TeacherRun, teacher_model_cls, teacher_configs, hard_weight: float = HARD_WEIGHT,
                 soft_weight: float = SOFT_WEIGHT, init_from_teacher: bool = True, charge_teacher: bool = True,
                 teacher_tokens_per_second: float | None = None):
        if hard_weight < 0 or soft_weight < 0 or hard_weight + soft_weight == 0:
            raise ValueError(f"--hard_weight and --soft_weight must be non-negative and not both 0, got "
                             f"{hard_weight} and {soft_weight}.")
        if teacher_tokens_per_second is not None and not teacher_tokens_per_second > 0:
            raise ValueError(f"--teacher_tokens_per_second must be positive, got {teacher_tokens_per_second}.")
        self.teacher, self.teacher_model_cls = teacher, teacher_model_cls
        self.teacher_cfg = teacher_configs.ModelConfig(**teacher.model_config)
        self.hard_weight, self.soft_weight = hard_weight, soft_weight
        self.init_from_teacher, self.charge_teacher = init_from_teacher, charge_teacher
        self.given_teacher_tokens_per_second = teacher_tokens_per_second
        self.budget = {}  # the charge's numbers, set by plan()
        self.student_weights_not_from_teacher = None  # set by the trainer

    @property
    def run_tag(self) -> str:
        return (f"_distilled{self.hard_weight:g}-{self.soft_weight:g}{'' if self.init_from_teacher else '-noinit'}"
                f"{'' if self.charge_teacher else '-uncharged'}_from-{self.teacher.run_dir.name}")

    def settings(self) -> dict:
        """What a resumed run must share with the run it continues."""
        return {"teacher": str(self.teacher.run_dir), "hard_weight": self.hard_weight,
                "soft_weight": self.soft_weight, "init_from_teacher": self.init_from_teacher,
                "charge_teacher": self.charge_teacher}

    def teacher_forward_tokens_per_second(self, reference_hardware: str) -> tuple[float | None, str]:
        """The teacher's forward throughput on the reference hardware, and where it comes from."""
        if self.given_teacher_tokens_per_second is not None:
            return self.given_teacher_tokens_per_second, "--teacher_tokens_per_second"
        rate, hardware = self.teacher.tokens_per_second, self.teacher.reference_hardware
        if rate is None or not throughput.hardware_matches(hardware, reference_hardware):
            why = ("has no reference throughput" if rate is None
                   else f"was charged at its throughput on {hardware}, not {reference_hardware}")
            return None, f"the teacher run {why}"
        return EVAL_SPEEDUP * rate, (f"{EVAL_SPEEDUP} x its training throughput of {rate:,.0f} tokens/s on "
                                     f"{hardware} (a forward is a third of a training step)")

    def plan(self, plan: Plan) -> Plan:
        """The plan with the teacher's forward charged to the class (fewer steps), or said not to be."""
        if plan.stages is not None:
            raise ValueError("Distillation does not support --stages (the teacher's forward would be charged per "
                             "stage at its own throughput); train the student at one length.")
        forward, source = self.teacher_forward_tokens_per_second(plan.reference_hardware)
        student = plan.tokens_per_second
        self.budget = {"teacher_charged": False, "teacher_forward_tokens_per_second": forward,
                       "teacher_forward_source": source, "student_tokens_per_second": student}
        if forward is None or student is None:
            if self.charge_teacher and plan.compute_class is not None:
                raise ValueError(f"The teacher's forward cannot be charged: {source}. Give its forward throughput on "
                                 f"{plan.reference_hardware} with --teacher_tokens_per_second N, or train without "
                                 "charging it with --charge_teacher false (results.json records that).")
            why = ("--charge_teacher false" if not self.charge_teacher else source if forward is None
                   else "the student's throughput is unknown")
            return self._noted(plan, f"Distillation: the teacher's forward is NOT charged to the budget ({why}).")
        charged = charged_tokens_per_second(student, forward)
        share = charged / forward  # of the reference time, spent in the teacher's forward when it is charged
        self.budget["teacher_share_when_charged"] = share
        if not self.charge_teacher:
            note = (f"Distillation: the teacher's forward is NOT charged to the budget (--charge_teacher false); "
                    f"charged, at {forward:,.0f} tokens/s ({source}), it would take {share:.0%} of the class.")
            return self._noted(plan, note)
        steps = plan.steps
        if plan.compute_class is not None:
            steps = training_steps(compute_class_seconds(plan.compute_class), charged, plan.global_batch_size,
                                   plan.seq_len)
        self.budget.update(teacher_charged=True, charged_tokens_per_second=charged)
        note = (f"Distillation: the teacher's forward ({forward:,.0f} tokens/s: {source}) is charged to the budget "
                f"with the student's training ({student:,.0f} tokens/s): {charged:,.0f} tokens/s of reference time "
                f"(the throughput above), the teacher taking {share:.0%} of it; {steps:,} steps"
                + (f" where a plain run trains {plan.steps:,}." if plan.compute_class is not None else "."))
        return self._noted(plan, note, tokens_per_second=charged, steps=steps)

    def _noted(self, plan: Plan, note: str, **changes) -> Plan:
        """The plan with `changes` and the note said under it, which the record keeps too."""
        self.budget["note"] = note
        return dataclasses.replace(plan, notes=plan.notes + (note,), **changes)

    def record(self) -> dict:
        """config.json's and results.json's "distillation"."""
        t = self.teacher
        return {"distillation": {
            **self.settings(), "teacher_project": t.project, "teacher_config": t.config, "teacher_steps": t.steps,
            **self.budget, "student_weights_not_from_teacher": self.student_weights_not_from_teacher}}

    def trainer(self, **kwargs) -> "DistillationTrainer":
        """languini.experiment.run's trainer_cls."""
        return DistillationTrainer(distillation=self, **kwargs)

    def check_student(self, dataset, model_cfg) -> None:
        """The student reads the teacher's data with its tokens, in windows the teacher's positions cover."""
        if dataset.fingerprint != self.teacher.dataset_fingerprint:
            raise ValueError(f"The teacher was trained on the dataset {self.teacher.dataset_fingerprint}, the student "
                             f"found {dataset.name} ({dataset.fingerprint}) in {dataset.dir}: give the teacher's "
                             "data with --data_root (its run's data_root is the default).")
        if model_cfg.vocab_size != self.teacher_cfg.vocab_size:
            raise ValueError(f"The student's vocabulary ({model_cfg.vocab_size}) is not the teacher's "
                             f"({self.teacher_cfg.vocab_size}).")
        teacher_len = getattr(self.teacher_cfg, "seq_len", model_cfg.seq_len)
        if model_cfg.seq_len > teacher_len:
            raise ValueError(f"The student's --seq_len {model_cfg.seq_len} is longer than the teacher's position "
                             f"table ({teacher_len}).")


class DistillationTrainer(Trainer):
    """The core trainer with the distillation loss as its objective (TrainStep.objective): the language-model
    part hard_weight x cross-entropy, and soft_weight x KL(teacher || student) as the auxiliary loss
    `distill_kl`, logged as `aux_distill_kl` beside the plain cross-entropy `loss`. The teacher's carried states
    (a stateful teacher) are saved in the checkpoint and resumed in a single process; a resumed multi-process run
    starts them afresh."""

    def __init__(self, *, distillation: Distillation, **kwargs):
        # before the trainer's own init, which may resume (load_state_dict)
        self.distillation = distillation
        self.teacher_states = [None] * kwargs["tcfg"].micro_batches
        super().__init__(**kwargs)
        d = distillation
        d.check_student(self.dataset, self.model_cfg)
        teacher_state = d.teacher.state_dict()
        # whole on every process, as its checkpoint is read (a teacher trained split, --expert_parallel, included):
        # its forward talks to no other process
        with model_parallel.single_process():
            self.teacher = d.teacher_model_cls(d.teacher_cfg)
        self.teacher.load_state_dict(teacher_state)
        self.teacher.to(self.device).eval().requires_grad_(False)
        matching = matching_weights(self.model, teacher_state)
        if d.init_from_teacher:
            d.student_weights_not_from_teacher = [n for n in self.model.state_dict() if n not in matching]
            if not kwargs.get("resume"):  # a resumed run's weights are its checkpoint's
                copy_matching_weights(self.model, teacher_state)
                if self.ddp.main:
                    print(f"Initialised {len(matching)} of the student's {len(self.model.state_dict())} tensors from "
                          f"the teacher; not from it: {', '.join(d.student_weights_not_from_teacher) or 'none'}.")
        self.step_runner.objective = self.objective

    def objective(self, micro_batch: int, x: torch.Tensor, logits: torch.Tensor, y: torch.Tensor,
                  cross_entropy: torch.Tensor) -> tuple[torch.Tensor, dict]:
        with torch.no_grad(), self.autocast():
            teacher_logits, state, _ = aux_loss.unpack(self.teacher(x, self.teacher_states[micro_batch]))
        self.teacher_states[micro_batch] = detach(state)
        d = self.distillation
        return d.hard_weight * cross_entropy, {"distill_kl": d.soft_weight * kl_to_teacher(logits, teacher_logits)}

    def state_dict(self) -> dict:
        return {**super().state_dict(), "distillation": self.distillation.settings(),
                "teacher_states": self.teacher_states}

    def load_state_dict(self, ckpt: dict) -> None:
        if ckpt.get("distillation") != self.distillation.settings():
            raise ValueError(f"The checkpoint in {self.run_dir} was trained with other distillation settings "
                             f"({ckpt.get('distillation')}); resume with the same flags or choose another --run_name.")
        super().load_state_dict(ckpt)
        if self.ddp.world_size == 1:
            self.teacher_states = ckpt["teacher_states"]
        elif model_contract.stateful(self.distillation.teacher_model_cls) and self.ddp.main:
            print("Note: the teacher's carried states start afresh in this resumed multi-process run.")
