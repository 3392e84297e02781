# Copied from EleutherAI/lm-evaluation-harness 0.4.13 (MIT License, Copyright (c) 2020 EleutherAI;
# full text in ../LICENSE-lm-evaluation-harness.md).


def doc_to_text(doc):
    answer_to_num = {"1": 0, "2": 1}
    return answer_to_num[doc["answer"]]


def doc_to_target(doc):
    idx = doc["sentence"].index("_") + 1
    return doc["sentence"][idx:].strip()


def doc_to_choice(doc):
    idx = doc["sentence"].index("_")
    options = [doc["option1"], doc["option2"]]
    return [doc["sentence"][:idx] + opt for opt in options]
