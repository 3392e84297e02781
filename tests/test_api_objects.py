"""The Python API takes objects besides names (promptopt/api.py, promptopt/models/memory.py): a loaded transformers
model and its tokenizer, a runner written against the `ModelRunner` Protocol alone, Strategy / DecisionRule / RuleKind
objects and task objects, none registered by the caller; cards measured on an in-memory model say what verify needs."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch

import promptopt
from promptopt.errors import ConfigError, UnsupportedError, UserError
from promptopt.models import GenerationResult, LoadedModel, LoglikelihoodResult, ModelRunner

SMALL = {"trials": 2, "dev_limit": 8, "test_limit": 8, "minibatch": 4, "scan": "off"}


@pytest.fixture
def loaded(tiny_llama_dir):
    """A model and tokenizer as a notebook has them: loaded by transformers, not by promptopt."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(tiny_llama_dir), AutoTokenizer.from_pretrained(tiny_llama_dir)


class PlainRunner:
    """A runner written against `promptopt.models.ModelRunner` alone (no promptopt Runner): one plain forward per
    request, greedy generation one token at a time. Its signatures are the Protocol's, with no **kwargs, so a call
    with a keyword the Protocol does not state fails."""

    def __init__(self, lm: LoadedModel) -> None:
        self.lm, self.batch_size, self.calls = lm, 2, 0

    def _states(self, ids) -> torch.Tensor:
        with torch.inference_mode():
            return self.lm.base(input_ids=torch.tensor([list(ids)], device=self.lm.device)).last_hidden_state[0]

    def loglikelihood(self, requests, *, tcb_targets=None, eps=1.0, groups=None):
        self.calls += 1
        head, out = self.lm.output_head, []
        for r, (ctx, cont) in enumerate(requests):
            states = self._states([*ctx, *cont])[len(ctx) - 1 : len(ctx) - 1 + len(cont)]
            logp = head.logits(states).log_softmax(-1)
            token_lp = [float(logp[j, t]) for j, t in enumerate(cont)]
            greedy = all(int(logp[j].argmax()) == t for j, t in enumerate(cont))
            tcb = None
            if tcb_targets is not None:
                res = head(states[:1], eps=eps, target=torch.tensor([int(tcb_targets[r])]))
                tcb = {name: value.cpu().tolist()[0] for name, value in res.to_dict().items()}
            out.append(LoglikelihoodResult(sum(token_lp), token_lp, greedy, states[0].float().cpu(), tcb))
        return out

    def generate(
        self,
        contexts,
        *,
        max_new_tokens=256,
        stop=(),
        logits_processor=None,
        processor_factory=None,
        temperature=0.0,
        top_p=1.0,
        seed=None,
        keep_hidden=True,
        batch_size=None,
    ):
        results = []
        limits = [max_new_tokens] * len(contexts) if isinstance(max_new_tokens, int) else list(max_new_tokens)
        for ids, limit in zip(contexts, limits):
            ids, tokens, hidden, reason = list(ids), [], [], "length"
            for _ in range(limit):
                state = self._states(ids)[-1]
                token = int(self.lm.output_head.logits(state[None]).argmax())
                tokens.append(token)
                hidden.append(state.float().cpu())
                ids.append(token)
                if token in self.lm.stop_token_ids:
                    reason = "eos"
                    break
            text = self.lm.tokenizer.decode(tokens, skip_special_tokens=True)
            ends = [
                len(self.lm.tokenizer.decode(tokens[: i + 1], skip_special_tokens=True)) for i in range(len(tokens))
            ]
            results.append(
                GenerationResult(tokens, text, reason, torch.stack(hidden) if hidden else torch.empty(0), ends)
            )
        return results


# --- a loaded model ---------------------------------------------------------------------------------------------
def test_search_export_verify_serve_on_a_loaded_model(loaded, tiny_llama_dir, tmp_path, monkeypatch):
    from fastapi.testclient import TestClient

    from promptopt.models import memory
    from promptopt.study.strategies import Strategy, accuracy_values
    from promptopt.tasks import load_task

    model, tokenizer = loaded
    mine = Strategy(
        name="notebook_accuracy", description="dev accuracy, defined in a notebook", item_values=accuracy_values
    )
    found = promptopt.search(
        task=load_task("sst2"), strategy=mine, model=(model, tokenizer), out=tmp_path / "s", **SMALL
    )
    assert found.config.model.spec == "in-memory:" + str(tiny_llama_dir)  # named by the model's name_or_path
    assert found.config.data.task == "sst2" and found.study.study_name == "sst2-notebook_accuracy"
    assert found.card_path.is_file()

    exported = promptopt.export(tmp_path / "s", out=tmp_path / "card.yaml")
    recorded = exported.card["model"]
    assert recorded["kind"] == "memory" and recorded["weights_method"] == "in-memory-tensors"
    assert recorded["weights_sha256"] == memory.tensors_sha256(model)
    assert promptopt.verify(exported.card_path, limit=4).ok  # the same process: the model is alive

    app = promptopt.serve(exported.card_path, model=promptopt.Model(model, tokenizer), run=False)
    with TestClient(app) as client:  # the app's lifespan runs its batcher
        answered = client.post("/v1/answer", json={"question": "a fine film"})
    assert answered.status_code == 200, answered.text
    assert answered.json()["card"]["model"] == found.config.model.spec

    # another process (no object behind the spec): verify says what it needs, in one line
    from promptopt.models import handles

    monkeypatch.setattr(handles, "HANDLES", {})
    with pytest.raises(
        UserError, match=r"measured on a model passed as an object .*promptopt\.Model\(model, tokenizer\)"
    ):
        promptopt.verify(exported.card_path, limit=4)
    # the weights given again, as an object or as the folder they came from: fingerprints over the tensors match
    again = promptopt.verify(exported.card_path, limit=4, model=(model, tokenizer))
    assert again.ok, again.lines()
    from_folder = promptopt.verify(exported.card_path, limit=4, model=str(tiny_llama_dir))
    assert [c.ok for c in from_folder.checks if c.name.startswith("model weights")][0], from_folder.lines()
    other = type(model)(model.config)  # other weights: the check fails
    changed = promptopt.verify(exported.card_path, limit=4, model=(other, tokenizer))
    assert not changed.ok and any(not c.ok and c.name.startswith("model weights") for c in changed.checks)


def test_an_in_memory_model_is_used_as_it_is_and_stays_in_its_process(loaded, tmp_path):
    model, tokenizer = loaded
    with pytest.raises(ConfigError, match="n_workers=2: worker processes cannot receive an in-memory model"):
        promptopt.search(task="sst2", model=(model, tokenizer), n_workers=2, out=tmp_path / "w", **SMALL)
    with pytest.raises(UnsupportedError, match="dtype float16: in-memory:.* computes in float32"):
        promptopt.search(task="sst2", model=(model, tokenizer), dtype="float16", out=tmp_path / "d", **SMALL)
    with pytest.raises(ConfigError, match="model: expected a model spec .* got int"):
        promptopt.search(task="sst2", model=3, out=tmp_path / "x", **SMALL)
    assert not (tmp_path / "w").exists() and not (tmp_path / "d").exists()

    from promptopt.models import memory

    spec = memory.register((model, tokenizer))
    assert memory.register(promptopt.Model(model, tokenizer)) == spec  # one object, one spec
    dropped = type(model)(model.config)
    dropped_spec = memory.register(promptopt.Model(dropped, tokenizer, name="dropped"))
    assert dropped_spec == "in-memory:dropped" and promptopt.score(task="sst2", model=dropped_spec, limit=2).summary
    del dropped
    gc.collect()
    with pytest.raises(UserError, match="was passed as an object and is not in this process"):
        promptopt.score(task="sst2", model=dropped_spec, limit=2)  # held weakly: a dropped model is freed, and said so


# --- a runner written against the Protocol alone --------------------------------------------------------------
def test_a_stand_in_runner_written_against_the_protocol_scores_and_searches(tiny_lm, tmp_path):
    runner = PlainRunner(tiny_lm)
    assert isinstance(runner, ModelRunner)
    ours = promptopt.score(task="sst2", model=runner, limit=6).table
    assert runner.calls > 0  # the stand-in answered, not promptopt's Runner
    theirs = promptopt.score(task="sst2", model=tiny_lm, limit=6).table
    assert ours["pred"].tolist() == theirs["pred"].tolist()
    np.testing.assert_allclose(np.stack(ours["choice_logprobs"]), np.stack(theirs["choice_logprobs"]), atol=1e-3)
    np.testing.assert_allclose(ours["tcb"], theirs["tcb"], rtol=1e-3)

    found = promptopt.search(task="sst2", model=runner, out=tmp_path / "s", **SMALL)
    assert found.card_path.is_file() and len(found.trials) >= 2


# --- strategies, decision rules and tasks as objects -----------------------------------------------------------
def test_strategy_and_rule_objects_need_no_registering_and_never_shadow_a_name():
    from promptopt.api import _decision_text, _strategy_name
    from promptopt.decision import DECISION_RULES, DecisionRule, RuleKind
    from promptopt.study.strategies import STRATEGIES, Strategy, accuracy_values

    builtin = STRATEGIES.get("accuracy")
    assert _strategy_name(builtin) == "accuracy"  # the registered object itself: its name
    impostor = Strategy(name="accuracy", description="not the built-in", item_values=accuracy_values)
    with pytest.raises(ConfigError, match="strategy 'accuracy' is already another strategy"):
        _strategy_name(impostor)
    first = Strategy(name="cell_strategy", description="v1", item_values=accuracy_values)
    second = Strategy(name="cell_strategy", description="v2", item_values=accuracy_values)
    assert _strategy_name(first) == "cell_strategy" and STRATEGIES.get("cell_strategy") is first
    assert _strategy_name(second) == "cell_strategy" and STRATEGIES.get("cell_strategy") is second  # a cell run again
    with pytest.raises(ConfigError, match="worker processes look strategys up by name|worker processes look"):
        _strategy_name(Strategy(name="cell_other", description="x", item_values=accuracy_values), n_workers=2)

    assert _decision_text(DecisionRule(kind="contextual")) == "contextual:acc"
    assert _decision_text(DecisionRule(kind="batch", mode="adaptive", reading="acc_norm")) == "batch-adaptive:acc_norm"
    with pytest.raises(ConfigError, match="carries fitted parameters"):
        _decision_text(DecisionRule(kind="contextual", bias=(0.1, -0.1), labels=("a", "b")))
    mine = RuleKind("cell_rule", "nothing", summary="argmax under another name")
    assert _decision_text(mine) == "cell_rule" and DECISION_RULES.get("cell_rule") is mine
    with pytest.raises(ConfigError, match="expected a rule name, a DecisionRule or a RuleKind, got int"):
        _decision_text(3)


def test_a_search_takes_a_rule_object(tiny_llama_dir, tmp_path):
    from promptopt.decision import DecisionRule

    found = promptopt.search(
        task="sst2", decision=DecisionRule(kind="contextual"), model=str(tiny_llama_dir), out=tmp_path / "r", **SMALL
    )
    assert found.config.study.decision == "contextual:acc"


def test_task_objects_are_recorded_by_their_file(tmp_path):
    import dataclasses

    from promptopt.api import _task_name
    from promptopt.tasks import load_task
    from promptopt.tasks.catalog import load_task_spec

    data = load_task("sst2")
    assert _task_name(data) == "sst2" and _task_name(data.spec) == "sst2"
    own = tmp_path / "mine.yaml"
    own.write_text(open(data.spec.where, encoding="utf-8").read().replace("name: sst2", "name: mine"))
    spec = load_task_spec(str(own))
    assert _task_name(spec) == str(own)
    with pytest.raises(ConfigError, match="differs from its file"):
        _task_name(dataclasses.replace(data.spec, instruction="edited in memory"))
    with pytest.raises(ConfigError, match="holds other items than its file carves"):
        _task_name(dataclasses.replace(data, dev=data.dev[:3]))
    with pytest.raises(ConfigError, match="expected a task name or path, a TaskSpec or a TaskData, got int"):
        _task_name(7)
